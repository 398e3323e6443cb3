"""Canaries of a release audit and how each is scored against the release alone.

One small class per kind of record (``CanaryDesign``): it draws m canaries that the private data does
not hold and scores each one from what the run would publish -- never from the model, the private
rows or the run's owner-only state. Higher score = more member-like.

* tables: canary rows drawn uniformly over the public schema's domain, so almost every one is a rare
  combination of values; score = how many released rows repeat the canary's cells exactly, then
  (ties) closeness of the nearest released row (a distance to closest record, DCR);
* texts: secrets of random pseudo-words (memorable, never produced by chance); score = the share of
  the secret's word 3-grams found in the released texts, then (ties) its word 1-grams.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dpsynth_core.errors import ConfigError


class CanaryDesign(ABC):
    """Draws canaries disjoint from the private records and scores them against the release."""

    kind: str  # "table" | "text"

    @abstractmethod
    def draw(self, count: int, existing: Any, rng: np.random.Generator) -> Any:
        """``count`` distinct canaries, none equal to a record of ``existing``."""

    @abstractmethod
    def score(self, canaries: Any, released: Any) -> np.ndarray:
        """One score per canary from the released records alone."""

    @abstractmethod
    def combine(self, records: Any, members: Any, rng: np.random.Generator) -> Any:
        """The audit run's private file: records plus the included canaries, in a secret order."""


@dataclass(frozen=True)
class TableColumn:
    """A column's public domain: its categories, or its bounds (``integer``: whole numbers)."""

    name: str
    categories: tuple[str, ...] | None = None
    low: float = 0.0
    high: float = 0.0
    integer: bool = True


class TableCanaries(CanaryDesign):
    kind = "table"

    def __init__(self, columns: list[TableColumn]) -> None:
        if not columns:
            raise ConfigError("a table audit needs at least one column")
        self.columns = columns

    def _draw_row(self, rng: np.random.Generator) -> tuple:
        row = []
        for c in self.columns:
            if c.categories is not None:
                row.append(c.categories[int(rng.integers(len(c.categories)))])
            elif c.integer:
                row.append(int(rng.integers(int(np.ceil(c.low)), int(np.floor(c.high)) + 1)))
            else:
                row.append(float(rng.uniform(c.low, c.high)))
        return tuple(row)

    def _keys(self, frame: pd.DataFrame) -> pd.Series:
        return frame[[c.name for c in self.columns]].astype(str).agg("\x1f".join, axis=1)

    def draw(self, count: int, existing: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
        names = [c.name for c in self.columns]
        taken = set(self._keys(existing)) if len(existing) else set()
        rows: list[tuple] = []
        for _ in range(50 * count):  # the cap only stops a domain too small for m distinct canaries
            if len(rows) == count:
                break
            row = self._draw_row(rng)
            key = "\x1f".join(map(str, row))
            if key not in taken:
                taken.add(key)
                rows.append(row)
        if len(rows) < count:
            raise ConfigError(f"the schema's domain is too small for {count} distinct canary rows absent from the "
                              "data: lower --canaries or audit more columns")
        return pd.DataFrame(rows, columns=names)

    def _distances(self, canaries: pd.DataFrame, released: pd.DataFrame) -> np.ndarray:
        """Each canary's mixed (Gower) distance to its closest released row, in [0, 1]."""
        total = np.zeros((len(canaries), len(released)))
        for c in self.columns:
            a, b = canaries[c.name].to_numpy(), released[c.name].to_numpy()
            if c.categories is not None:
                total += a.astype(str)[:, None] != b.astype(str)[None, :]
            else:
                span = max(c.high - c.low, 1e-12)
                total += np.minimum(np.abs(a.astype(float)[:, None] - pd.to_numeric(b, errors="coerce")[None, :]) / span, 1.0)
        return np.nan_to_num(total / len(self.columns), nan=1.0).min(axis=1)

    def score(self, canaries: pd.DataFrame, released: pd.DataFrame) -> np.ndarray:
        missing = [c.name for c in self.columns if c.name not in released.columns]
        if missing:
            raise ConfigError(f"the released table lacks the audited columns {missing}")
        counts = self._keys(released).value_counts()
        density = self._keys(canaries).map(counts).fillna(0).to_numpy(dtype=float)
        closeness = 1.0 - self._distances(canaries, released) if len(released) else np.zeros(len(canaries))
        return density + 0.5 * closeness  # a repeat of the whole row outranks any near miss

    def combine(self, records: pd.DataFrame, members: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
        out = pd.concat([records[members.columns], members], ignore_index=True)
        return out.iloc[rng.permutation(len(out))].reset_index(drop=True)


_WORD = re.compile(r"[a-z]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


class TextCanaries(CanaryDesign):
    """Secrets such as "the access code is vokrat misule danopi ...": pseudo-words of 3 random syllables."""

    kind = "text"
    PREFIX = "the access code is"

    def __init__(self, words: int = 6, labels: tuple[str, ...] = (), keep: Callable[[str], bool] | None = None) -> None:
        self.words = words
        self.labels = labels  # labelled records (WASP / Aug-PE): each canary gets a class drawn uniformly
        # a public test a canary must pass to reach the mechanism when included (ACTG sets aside held-out
        # evaluation rows by a content key): a canary that fails it is redrawn, so none is diluted
        self.keep = keep

    @staticmethod
    def _pseudo_word(rng: np.random.Generator) -> str:
        consonants, vowels = "bdfgklmnprstvz", "aeiou"
        return "".join(consonants[int(rng.integers(len(consonants)))] + vowels[int(rng.integers(len(vowels)))]
                       for _ in range(3))

    def draw(self, count: int, existing, rng: np.random.Generator) -> list[str]:
        taken = set(existing["text"] if isinstance(existing, pd.DataFrame) else existing)
        texts: list[str] = []
        while len(texts) < count:  # 14^3 * 5^3 choices per word: repeats are astronomically rare
            text = f"{self.PREFIX} " + " ".join(self._pseudo_word(rng) for _ in range(self.words)) + "."
            if text not in taken and (self.keep is None or self.keep(text)):
                taken.add(text)
                texts.append(text)
        return texts

    def score(self, canaries: list[str], released: list[str]) -> np.ndarray:
        prefix = len(_words(self.PREFIX))
        seen3: set = set()
        seen1: set = set()
        for text in released:
            words = _words(text)
            seen3 |= _ngrams(words, 3)
            seen1 |= set(words)
        scores = []
        for canary in canaries:
            secret = _words(canary)[prefix:]
            grams = _ngrams(secret, 3)
            share3 = len(grams & seen3) / max(len(grams), 1)
            share1 = len(set(secret) & seen1) / max(len(set(secret)), 1)
            scores.append(share3 + 0.01 * share1)
        return np.asarray(scores, dtype=float)

    def combine(self, records, members: list[str], rng: np.random.Generator):
        """Texts, or a frame of ``text`` and ``label`` when the records are labelled."""
        if not isinstance(records, pd.DataFrame):
            out = list(records) + list(members)
            return [out[i] for i in rng.permutation(len(out))]
        if not self.labels:
            raise ConfigError("labelled records need the public class names to label the canaries")
        labels = [self.labels[int(rng.integers(len(self.labels)))] for _ in members]
        out = pd.concat([records[["text", "label"]], pd.DataFrame({"text": list(members), "label": labels})],
                        ignore_index=True)
        return out.iloc[rng.permutation(len(out))].reset_index(drop=True)

