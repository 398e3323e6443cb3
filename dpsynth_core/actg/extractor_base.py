"""What every attribute extractor shares: the interface (``AttributeExtractor``), IFAcc, and snapping
a free-form answer to one of a field's options.

Below every implementation (``extractors``: embedding, LM, OpenAI; ``supervised``: the trained reward),
so ``extractors.build_extractor`` can build a supervised one without a cycle.
"""

from __future__ import annotations

import abc
import difflib
from typing import Sequence

from dpsynth_core.actg.schema import AttributeField, AttributeSchema
from dpsynth_core.errors import DataError


class AttributeExtractor(abc.ABC):
    """Maps texts to attribute rows ``{field: option}`` whose values are always schema options."""

    def __init__(self, schema: AttributeSchema) -> None:
        self.schema = schema

    @abc.abstractmethod
    def extract(self, texts: list[str]) -> list[dict[str, str]]:
        """One ``{field: option}`` per text, every field of the schema, every value an option."""

    def ifacc(self, texts: list[str], target_attrs: Sequence[dict[str, str]]) -> list[float]:
        """Instruction-following accuracy: per text, the fraction of the K target attributes
        that the extractor recovers from it."""
        if len(texts) != len(target_attrs):
            raise DataError(f"ifacc: {len(texts)} texts but {len(target_attrs)} attribute rows")
        if not texts:
            return []
        extracted = self.extract(list(texts))
        return ifacc_scores(extracted, target_attrs, self.schema.field_names)


def ifacc_scores(extracted: Sequence[dict[str, str]], targets: Sequence[dict[str, str]],
                 fields: Sequence[str]) -> list[float]:
    """Fraction of ``fields`` on which each extracted row equals its target row."""
    return [sum(e.get(f) == t.get(f) for f in fields) / len(fields) for e, t in zip(extracted, targets)]


def snap_to_option(value: object, field: AttributeField) -> str:
    """The option closest to a free-form answer: exact, case-insensitive, substring, then fuzzy.
    Falls back to "Other" if the field has it, else to the first option."""
    options = field.options
    if isinstance(value, str):
        v = value.strip().strip("\"'` .")
        if v in options:
            return v
        folded = {o.casefold(): o for o in options}
        if v.casefold() in folded:
            return folded[v.casefold()]
        contained = [o for o in options if o.casefold() in v.casefold() or (v and v.casefold() in o.casefold())]
        if len(contained) == 1:
            return contained[0]
        pool = contained or options
        close = difflib.get_close_matches(v.casefold(), [o.casefold() for o in pool], n=1, cutoff=0.5)
        if close:
            return {o.casefold(): o for o in pool}[close[0]]
    return _fallback_option(field)


def _fallback_option(field: AttributeField) -> str:
    for o in field.options:
        if o.casefold() == "other":
            return o
    return field.options[0]
