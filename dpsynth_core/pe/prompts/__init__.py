"""Prompt templates as data files: ``prompts/<task>/{zero_shot,variation,contrastive}.txt`` and the
optional ``few_shot.txt`` (good examples only: WASP's no-contrastive ablation)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from dpsynth_core.errors import ConfigError

PROMPTS_DIR = Path(__file__).resolve().parent
_NAMES = ("zero_shot", "variation", "contrastive")
_OPTIONAL = ("few_shot",)


@dataclass(frozen=True)
class PromptSet:
    zero_shot: str
    variation: str
    contrastive: str
    few_shot: str | None = None
    example_format: str = "{index}. {text}"
    max_example_chars: int = 600

    def render_zero_shot(self, label: str) -> str:
        return self.zero_shot.format(label=label)

    def render_variation(self, label: str, sample: str) -> str:
        return self.variation.format(label=label, sample=sample[: self.max_example_chars])

    def _examples(self, texts: list[str]) -> str:
        return "\n".join(
            self.example_format.format(index=i + 1, text=t[: self.max_example_chars].replace("\n", " "))
            for i, t in enumerate(texts)
        ) or "(none)"

    def render_few_shot(self, label: str, good: list[str]) -> str:
        if self.few_shot is None:
            raise ConfigError("prompts: contrastive: false needs a few_shot.txt template (good examples only)")
        return self.few_shot.format(label=label, good=self._examples(good))

    def render_contrastive(self, label: str, good: list[str], bad: list[str]) -> str:
        return self.contrastive.format(label=label, good=self._examples(good), bad=self._examples(bad))


def load_prompts(task: str | Path) -> PromptSet:
    """Templates of a bundled task (e.g. ``"biorxiv"``) or of a directory with the same files."""
    folder = Path(task) if Path(task).is_dir() else PROMPTS_DIR / str(task)
    if not folder.is_dir():
        known = sorted(p.name for p in PROMPTS_DIR.iterdir() if p.is_dir() and not p.name.startswith("_"))
        raise ConfigError(f"prompts: no template folder for task '{task}' (bundled: {', '.join(known)})")
    texts = {}
    for name in _NAMES:
        f = folder / f"{name}.txt"
        if not f.is_file():
            raise ConfigError(f"{f}: prompt template missing")
        texts[name] = f.read_text(encoding="utf-8").rstrip("\n") + "\n"
    for name in _OPTIONAL:
        if (folder / f"{name}.txt").is_file():
            texts[name] = (folder / f"{name}.txt").read_text(encoding="utf-8").rstrip("\n") + "\n"
    extra = {}
    meta = folder / "task.yaml"
    if meta.is_file():
        raw = yaml.safe_load(meta.read_text(encoding="utf-8")) or {}
        extra = {k: raw[k] for k in ("example_format", "max_example_chars") if k in raw}
    return PromptSet(**texts, **extra)
