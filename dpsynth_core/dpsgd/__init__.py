"""DP-SGD LoRA fine-tuning: per-sample clipping (opacus hooks / ghost), Poisson sampling that
matches the accountant, noise calibrated to the stage's epsilon, ledger accounting, resume.

    result = train_dp_lora(examples, DpSgdConfig(epsilon=4, steps=200, ...), output_dir=..., ledger=ledger)
    model, tokenizer = load_generator(config.model, result.adapter_dir)

Several workers (``num_workers > 1``): the driver passes the runner and a source the workers load:

    train_dp_lora(TableExampleSource(path=..., text_column=...), config, output_dir=..., ledger=ledger,
                  runner=ray_jobs.dp_finetune.run_dp_finetune)
"""

import importlib

# Lazy exports (PEP 562): the trainer imports torch, which every CLI command would otherwise pay
# for at start-up (seconds), even `dpsynth --help`.
_EXPORTS = {
    "DpSgdConfig": "config", "LoraSettings": "config", "TrainExample": "config", "TrainResult": "config",
    "ExampleSource": "sources", "LoaderSource": "sources", "TableExampleSource": "sources",
    "DistributedRunner": "trainer", "load_generator": "trainer", "train_dp_lora": "trainer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
