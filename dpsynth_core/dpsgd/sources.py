"""Where a DP-SGD stage's private training examples come from.

A distributed runner ships work to other processes (Ray Train workers). What it ships goes
through Ray's control plane -- task arguments, ``train_loop_config``, Train's run state -- so it
must be public. An ``ExampleSource`` is that public description; ``load()`` reads the private
data and runs inside each worker:

- ``TableExampleSource``: a file (CSV / JSONL / Parquet) and the column spec of ``dpsynth train``;
- ``LoaderSource``: a module-level function (with public arguments, e.g. a config and a run
  directory) that rebuilds the examples from their source, for pipelines whose examples are
  derived (ACTG: records + extracted attributes);
- ``InMemoryExamples``: examples already in this process. Fine in-process; a distributed runner
  refuses it, since the records themselves would have to travel.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, ClassVar, Protocol, runtime_checkable

from pydantic import Field, model_validator

from dpsynth_core.config import TEXT_CHARS_CAP, StrictConfig
from dpsynth_core.dpsgd.config import TrainExample
from dpsynth_core.errors import ConfigError


@runtime_checkable
class ExampleSource(Protocol):
    """A public description of private training examples; ``load()`` reads them."""

    def load(self) -> list[TrainExample]: ...

    def describe(self) -> str:
        """One public line (file, columns, loader name), for errors and logs; never a record."""
        ...


class InMemoryExamples:
    """Examples already in memory. Not shippable: a distributed runner must refuse it."""

    shippable = False

    def __init__(self, examples: Sequence[TrainExample]):
        self._examples = list(examples)

    def load(self) -> list[TrainExample]:
        return self._examples

    def describe(self) -> str:
        return "training examples held in memory"

    def __reduce__(self):  # a safety net: pickling would copy every private record
        raise TypeError("InMemoryExamples holds private records and must not be pickled or sent to a worker")


class TableExampleSource(StrictConfig):
    """A data file and how a row becomes (prompt, target); the spec of ``dpsynth train``'s ``data:``.

    ``path`` must be readable where ``load()`` runs (on a cluster: a shared path)."""

    path: str
    text_column: str = Field(alias="text_col")  # the target text (loss is taken on it); key `text_col`
    prompt_columns: list[str] = Field(default_factory=list)
    # e.g. "Category: {category}\n"; default: one "column: value" line per prompt column
    prompt_template: str | None = None
    user_column: str | None = Field(None, alias="user_col")  # set for user-level DP; key `user_col`
    max_records: int | None = Field(None, ge=1)
    max_chars: Annotated[int, TEXT_CHARS_CAP] = Field(20000, ge=1)

    @model_validator(mode="after")
    def _template_fields(self) -> TableExampleSource:
        if self.prompt_template is not None:
            fields = {f for _, f, _, _ in string.Formatter().parse(self.prompt_template) if f}
            unknown = sorted(fields - set(self.prompt_columns))
            if unknown:
                raise ValueError(f"prompt_template uses {unknown}, which are not in prompt_columns {self.prompt_columns}")
        return self

    shippable: ClassVar[bool] = True

    def load(self) -> list[TrainExample]:
        """Read through ``dpsynth_core.data.load_records`` (errors name file/column/row, not values)."""
        from dpsynth_core.data import load_records

        frame = load_records(
            Path(self.path), text_col=self.text_column, user_col=self.user_column,
            columns=list(self.prompt_columns) or None, max_chars=self.max_chars,
        )
        if self.max_records is not None:
            frame = frame.iloc[: self.max_records]
        examples = []
        for _, row in frame.iterrows():
            values = {c: "" if row[c] is None else str(row[c]) for c in self.prompt_columns}
            if self.prompt_template is not None:
                prompt = self.prompt_template.format(**values)
            else:
                prompt = "".join(f"{c}: {v}\n" for c, v in values.items())
            user = str(row[self.user_column]) if self.user_column else None
            examples.append(TrainExample(prompt=prompt, target=str(row[self.text_column]), user_id=user))
        return examples

    def describe(self) -> str:
        return f"{self.path} (text column '{self.text_column}')"


class LoaderSource:
    """``loader()`` rebuilds the examples from their source; pickled by reference to a module-level
    function, so its arguments (``functools.partial``) must be public config, never records."""

    shippable = True

    def __init__(self, loader: Callable[[], Sequence[TrainExample]], description: str):
        function = loader.func if isinstance(loader, functools.partial) else loader
        qualname = getattr(function, "__qualname__", "")
        if not callable(loader) or not getattr(function, "__module__", None) or "<" in qualname:
            raise ConfigError(
                "LoaderSource needs a module-level function (or a functools.partial of one), not a lambda or "
                "closure: a closure carries its captured values, which may be private, to every worker"
            )
        self.loader, self.description = loader, description

    def load(self) -> list[TrainExample]:
        return list(self.loader())

    def describe(self) -> str:
        return self.description


def as_source(examples: Sequence[TrainExample] | ExampleSource) -> ExampleSource:
    """An ExampleSource for what ``train_dp_lora`` was given (a plain list stays in memory)."""
    if isinstance(examples, ExampleSource):
        return examples
    return InMemoryExamples(examples)


def is_shippable(source: ExampleSource) -> bool:
    """Whether ``source`` may be sent to another process (it describes the data, not holds it)."""
    return bool(getattr(source, "shippable", False))
