"""Cards and exports in ``release/``: a Hugging Face dataset card (``README.md``), a model card when an adapter is
released (``MODEL_CARD.md``), the synthetic data as Parquet and as a ``datasets`` folder (``save_to_disk``).

Release content: built ONLY from the release manifest (the ledger's guarantee), the release's own files (DP
outputs) and public names (method, base model). Nothing here reads ``metrics.json``, ``eval/`` or any other
owner-side file; tests/test_report.py plants values there and checks that none reaches ``release/``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd

from dpsynth_core.runs.release import add_to_release, release_dir

PARQUET = "synthetic.parquet"
HF_DATASET = "hf_dataset"
INTENDED = {
    "text": "exploratory analysis, prototyping and training text models where the real texts may not be shared",
    "table": "exploratory analysis, prototyping, and training and testing tabular models where the real rows may not "
             "be shared",
}


def synthetic_frame(release: Path) -> tuple[pd.DataFrame, str] | None:
    """The released synthetic data as a frame, and its kind (text / table); None when the run released none."""
    if (release / "synthetic.csv").is_file():
        return pd.read_csv(release / "synthetic.csv", keep_default_na=False), "table"
    if (release / "synthetic.jsonl").is_file():
        rows = [json.loads(line) for line in (release / "synthetic.jsonl").read_text(encoding="utf-8").splitlines()
                if line.strip()]
        frame = pd.DataFrame(rows)
        if "attributes" in frame.columns:  # ACTG: one column per attribute, flat for Parquet readers
            attrs = pd.DataFrame(list(frame.pop("attributes").map(lambda a: a or {})))
            frame = pd.concat([frame, attrs.add_prefix("attr_")], axis=1)
        return frame, "text"
    return None


def adapters(release: Path) -> list[Path]:
    return sorted(p.parent for p in release.rglob("adapter_config.json"))


def _guarantee(manifest: dict, unit: str) -> str:
    if manifest.get("not_private"):
        return "**NOT differentially private** (a reference run with ε = ∞): do not publish it as DP data."
    return (f"(ε = {manifest['epsilon']:.4f}, δ = {manifest['delta']:.3g})-differential privacy, unit of privacy: one "
            f"{unit} of the private data (add/remove adjacency); m·δ = {manifest.get('m_times_delta') or 'n/a'} "
            f"with the public working-set size m = {manifest.get('public_size') or 'n/a'}; budget "
            f"{manifest['epsilon_budget']:g}.")


def dataset_card(manifest: dict, method: str, unit: str, frame: pd.DataFrame, kind: str) -> str:
    rows = len(frame)
    size = "n<1K" if rows < 1000 else "1K<n<10K" if rows < 10_000 else "10K<n<100K"
    task = "text-generation" if kind == "text" else "tabular-classification"
    yaml_header = "\n".join([
        "---", "license: other", f"pretty_name: {manifest.get('dataset', 'synthetic data')} (synthetic, {method})",
        "tags:", "- synthetic", "- differential-privacy", "- dpsynth", f"task_categories:\n- {task}",
        f"size_categories:\n- {size}", "configs:", "- config_name: default", "  data_files:", "  - split: train",
        f"    path: {PARQUET}", "---", ""])
    columns = ", ".join(f"`{c}`" for c in frame.columns)
    return yaml_header + f"""
# Synthetic data: {manifest.get('dataset', '')}

Made by dpsynth's **{method}** pipeline. Every mechanism that read the private data is recorded in `ledger.json`
(`ledger.txt` in words); the whole release is covered by one guarantee:

**Privacy:** {_guarantee(manifest, unit)}

## Contents

- `{PARQUET}` and `{HF_DATASET}/` (Hugging Face `datasets`, `load_from_disk`): {rows} synthetic {'texts' if kind == 'text' else 'rows'}, columns {columns}.
- `ledger.json`, `ledger.txt`: the privacy ledger; `MANIFEST.json`: every file's sha256 and the guarantee.

## How it was made

The private data was read only by the DP mechanisms in the ledger; everything after them (generation, selection,
formatting) post-processes DP outputs and spends nothing. Config seeds seed that post-processing only; the DP noise
came from OS entropy.

## Intended use

{INTENDED[kind]}.

## Limits

- Differential privacy bounds what the data reveals about any one {unit}; it does not make the data accurate.
  Quality was measured by the data owner against real data; those figures read real data and are not part of
  this release.
- Synthetic {'texts can be fluent and wrong' if kind == 'text' else 'rows can hold combinations no real row has'}; do
  not draw conclusions about individuals from it.
- Groups that are rare in the private data are the least faithfully reproduced.
"""


def _adapter_config(adapter: Path) -> dict:
    """adapter_config.json, with the base model named as dpsynth's registry does (dp_training.json) when known."""
    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    config["_path"] = config.get("base_model_name_or_path")
    summary = adapter / "dp_training.json"
    if summary.is_file():
        config["base_model_name_or_path"] = json.loads(summary.read_text(encoding="utf-8")).get(
            "base_model", config.get("base_model_name_or_path"))
    return config


def model_card(manifest: dict, method: str, unit: str, adapter_dirs: list[Path], release: Path) -> str:
    """One card (one YAML header) for every adapter in the release (ACTG releases the DP generator and the RL one)."""
    configs = [_adapter_config(a) for a in adapter_dirs]
    named = {c["_path"]: c["base_model_name_or_path"] for c in configs if c["_path"] != c["base_model_name_or_path"]}
    for c in configs:  # ACTG's RL adapter has no dp_training.json: the same base, named as its sibling names it
        c["base_model_name_or_path"] = named.get(c["_path"], c["base_model_name_or_path"])
    bases = sorted({c.get("base_model_name_or_path") or "see adapter_config.json" for c in configs})
    header = "\n".join(["---", "library_name: peft", "base_model:", *[f"- {b}" for b in bases],
                        "tags:", "- differential-privacy", "- lora", "- dpsynth", "---", ""])
    listed = "\n".join(f"- `{a.relative_to(release)}/`: LoRA rank {c.get('r', 'n/a')} on **{c.get('base_model_name_or_path')}**"
                       for a, c in zip(adapter_dirs, configs))
    return header + f"""
# DP LoRA adapters ({method})

{listed}

Fine-tuned with DP-SGD (per-example clipping, Gaussian noise) by dpsynth; an adapter trained after DP-SGD on
synthetic data only (ACTG's RL adapter) is post-processing and carries the same guarantee.

**Privacy:** {_guarantee(manifest, unit)} An adapter's own accounting is in its `dp_training.json` when present.

## Intended use

Generating synthetic data like this release's. No training loss or sampling seed is released with the adapters.

## Limits

A DP adapter can still reproduce public patterns of its base model; quality figures were measured owner-side and
are not part of this release.
"""


def write_cards(run_dir: Path, method: str, unit: str) -> list[str]:
    """Add the cards and exports to ``release/`` (through its manifest); the names added."""
    release = release_dir(run_dir)
    manifest = json.loads((release / "MANIFEST.json").read_text(encoding="utf-8"))
    found = synthetic_frame(release)
    with tempfile.TemporaryDirectory(prefix=".cards-", dir=run_dir) as tmp:
        tmp = Path(tmp)
        items: dict[str, Path] = {}
        if found is not None:
            frame, kind = found
            frame.to_parquet(tmp / PARQUET, index=False)
            _save_hf(frame, tmp / HF_DATASET)
            (tmp / "README.md").write_text(dataset_card(manifest, method, unit, frame, kind), encoding="utf-8")
            items.update({PARQUET: tmp / PARQUET, HF_DATASET: tmp / HF_DATASET, "README.md": tmp / "README.md"})
        found_adapters = adapters(release)
        if found_adapters:
            (tmp / "MODEL_CARD.md").write_text(model_card(manifest, method, unit, found_adapters, release),
                                               encoding="utf-8")
            items["MODEL_CARD.md"] = tmp / "MODEL_CARD.md"
        if items:
            add_to_release(run_dir, items)
    return sorted(items)


def _save_hf(frame: pd.DataFrame, dest: Path) -> None:
    import datasets

    datasets.disable_progress_bars()  # a run's output stays quiet (dpsynth_core.quiet)
    datasets.Dataset.from_pandas(frame, preserve_index=False).save_to_disk(str(dest))
