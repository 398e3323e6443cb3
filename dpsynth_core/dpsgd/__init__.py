"""DP-SGD LoRA fine-tuning: per-sample clipping (opacus hooks / ghost), Poisson sampling that
matches the accountant, noise calibrated to the stage's epsilon, ledger accounting, resume.

    result = train_dp_lora(examples, DpSgdConfig(epsilon=4, steps=200, ...), output_dir=..., ledger=ledger)
    model, tokenizer = load_generator(config.model, result.adapter_dir)

Several workers (``num_workers > 1``): the driver passes the runner and a source the workers load:

    train_dp_lora(TableExampleSource(path=..., text_column=...), config, output_dir=..., ledger=ledger,
                  runner=ray_jobs.dp_finetune.run_dp_finetune)
"""

from dpsynth_core.dpsgd.config import DpSgdConfig, LoraSettings, TrainExample, TrainResult
from dpsynth_core.dpsgd.sources import ExampleSource, LoaderSource, TableExampleSource
from dpsynth_core.dpsgd.trainer import DistributedRunner, load_generator, train_dp_lora

__all__ = ["DistributedRunner", "DpSgdConfig", "ExampleSource", "LoaderSource", "LoraSettings", "TableExampleSource",
           "TrainExample", "TrainResult", "load_generator", "train_dp_lora"]
