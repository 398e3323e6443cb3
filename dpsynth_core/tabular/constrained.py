"""Constrained decoding: a ``LogitsProcessor`` that only lets each column emit valid tokens.

Per generated row a small state machine walks the row's segments (see ``serialize``):

* name segments (``"age:"``, ``", workclass:"``) are *forced*, token by token;
* categorical values follow a trie over the token ids of ``" " + category`` for each category;
* numeric values follow a character-level automaton over the tokens made only of number
  characters: a token is allowed iff the value text stays a prefix of some canonical number
  (fixed precision, no leading zeros) inside the column's [min, max];
* after the last value only EOS is allowed.

Every sequence this processor lets through therefore parses (100 % valid rows), provided
``max_new_tokens >= RowConstraint.max_row_tokens(order)``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import torch
from transformers import LogitsProcessor

from dpsynth_core.tabular.schema import ColumnSpec
from dpsynth_core.tabular.serialize import RowSerializer

_NUMBER_CHARS = re.compile(r"[ \-.0-9]+")
_BODY_PREFIX = re.compile(r"(-?)(0|[1-9][0-9]*)?(\.([0-9]*))?")


@dataclass
class _TrieNode:
    children: dict[int, _TrieNode] = field(default_factory=dict)
    terminal: bool = False


def _number_tokens(tokenizer) -> list[tuple[int, str]]:
    return _number_tokens_cached(id(tokenizer), tokenizer)


@lru_cache(maxsize=8)
def _number_tokens_cached(_key: int, tokenizer) -> list[tuple[int, str]]:
    vocab = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(vocab)], clean_up_tokenization_spaces=False)
    special = set(tokenizer.all_special_ids)
    return [(i, t) for i, t in enumerate(texts) if i not in special and t and _NUMBER_CHARS.fullmatch(t)]


class NumberAutomaton:
    """Which texts are prefixes of (or complete) canonical numbers of one column."""

    def __init__(self, col: ColumnSpec):
        self.p = col.decimals
        self.lo, self.hi = col.grid_bounds()  # the canonical values inside [min, max]
        self.max_abs_int = max(abs(int(float(col.min))), abs(int(float(col.max))), 1)  # type: ignore[arg-type]

    def _abs_target(self, negative: bool) -> tuple[int, int] | None:
        if negative:
            lo, hi = max(1, -self.hi), -self.lo  # abs >= 1: no negative zero
        else:
            lo, hi = max(0, self.lo), self.hi
        return (lo, hi) if lo <= hi else None

    def feasible(self, text: str) -> bool:
        """True iff ``text`` (with its leading space) can still be completed to a valid number."""
        if text == "":
            return True
        if not text.startswith(" "):
            return False
        m = _BODY_PREFIX.fullmatch(text[1:])
        if not m:
            return False
        sign, ipart, dot, frac = m.group(1), m.group(2), m.group(3), m.group(4) or ""
        if dot is not None and (self.p == 0 or ipart is None or len(frac) > self.p):
            return False
        if sign:
            candidates = [self._abs_target(True)]
        elif ipart is None:  # nothing but the space yet: a '-' may still come
            candidates = [self._abs_target(False), self._abs_target(True)]
        else:  # digits without a sign: the value is >= 0
            candidates = [self._abs_target(False)]
        targets = [t for t in candidates if t]
        if not targets:
            return False
        if ipart is None:
            return True
        scale = 10**self.p
        if dot is not None:
            base = int(ipart) * scale
            ranges = [(base + int(frac.ljust(self.p, "0")), base + int(frac.ljust(self.p, "9")))]
        elif ipart == "0":
            ranges = [(0, scale - 1)]
        else:
            i, ranges, k = int(ipart), [], 0
            while i * 10**k <= self.max_abs_int:
                ranges.append((i * 10**k * scale, (i + 1) * 10**k * scale - 1))
                k += 1
        return any(a <= t_hi and t_lo <= b for a, b in ranges for t_lo, t_hi in targets)

    def complete(self, text: str) -> bool:
        if not text.startswith(" "):
            return False
        m = _BODY_PREFIX.fullmatch(text[1:])
        if not m or m.group(2) is None:
            return False
        frac = m.group(4)
        if self.p == 0 and m.group(3) is not None:
            return False
        if self.p > 0 and (frac is None or len(frac) != self.p):
            return False
        scaled = int(m.group(2)) * 10**self.p + (int(frac) if frac else 0)
        if m.group(1):
            return scaled != 0 and self.lo <= -scaled <= self.hi
        return self.lo <= scaled <= self.hi


class RowConstraint:
    """Everything precomputed once per (serializer, tokenizer): forced ids, tries, number tokens."""

    def __init__(self, serializer: RowSerializer, tokenizer):
        self.serializer = serializer
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token_id
        self._forced: dict[tuple[int, str], list[int]] = {}
        self.tries: dict[str, _TrieNode] = {}
        self.cat_ids: dict[str, dict[str, list[int]]] = {}
        self.numbers: dict[str, NumberAutomaton] = {}
        for col in serializer.schema.columns:
            if col.is_categorical:
                root, ids_of = _TrieNode(), {}
                for cat in col.categories or []:
                    ids = self._encode(serializer.value_segment(cat))
                    ids_of[cat] = ids
                    node = root
                    for t in ids:
                        node = node.children.setdefault(t, _TrieNode())
                    node.terminal = True
                self.tries[col.name], self.cat_ids[col.name] = root, ids_of
            else:
                self.numbers[col.name] = NumberAutomaton(col)
        self.number_tokens = _number_tokens(tokenizer) if self.numbers else []
        self._num_cache: dict[tuple[str, str], list[int]] = {}

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def forced(self, position: int, name: str) -> list[int]:
        key = (position, name)
        if key not in self._forced:
            self._forced[key] = self._encode(self.serializer.name_segment(position, name))
        return self._forced[key]

    def next_segment(self, order: Sequence[str], position: int) -> list[int]:
        """Forced ids after the value at ``position``: the next name, or EOS after the last."""
        return self.forced(position + 1, order[position + 1]) if position + 1 < len(order) else [self.eos]

    def number_extensions(self, name: str, text: str) -> list[int]:
        key = (name, text)
        if key not in self._num_cache:
            auto = self.numbers[name]
            self._num_cache[key] = [i for i, s in self.number_tokens if auto.feasible(text + s)]
        return self._num_cache[key]

    def max_row_tokens(self, order: Sequence[str]) -> int:
        """Upper bound on generated tokens for one row (use as ``max_new_tokens``)."""
        total = 1  # EOS
        for pos, name in enumerate(order):
            total += len(self.forced(pos, name))
            col = self.serializer.schema.column(name)
            if col.is_categorical:
                total += max(len(v) for v in self.cat_ids[name].values())
            else:
                total += 2 + max(len(col.format_value(col.min)), len(col.format_value(col.max)))
        return total


class RowState:
    """Decoding state of one row. ``fixed``: categorical values this row must take (column -> category),
    forced token by token like the name segments, e.g. the sensitive value of a stratified pool."""

    def __init__(self, constraint: RowConstraint, order: Sequence[str], fixed: dict[str, str] | None = None):
        self.c, self.order = constraint, list(order)
        self.fixed = dict(fixed or {})
        for name, value in self.fixed.items():
            if value not in constraint.cat_ids.get(name, {}):
                raise ValueError(f"constrained decoding: cannot fix column '{name}' to a value outside its categories")
        self.pos = 0
        self.node: _TrieNode | None = None
        self.queue: list[int] = list(constraint.forced(0, self.order[0])) + self._fixed_value(self.order[0])
        self.text = ""
        self.done = False
        self.value_start_logits: dict[str, torch.Tensor] = {}  # column -> raw logits at its first value token

    def _fixed_value(self, name: str) -> list[int]:
        """The fixed value's ids for the queue (and the trie node it ends at), or [] for a free column."""
        if name not in self.fixed:
            return []
        ids = self.c.cat_ids[name][self.fixed[name]]
        node = self.c.tries[name]
        for t in ids:
            node = node.children[t]
        self.node = node
        return list(ids)

    @property
    def in_value(self) -> bool:
        return not self.done and not self.queue

    @property
    def column(self) -> str:
        return self.order[self.pos]

    def _value_complete(self) -> bool:
        name = self.column
        if name in self.c.tries:
            return bool(self.node and self.node.terminal)
        return self.c.numbers[name].complete(self.text)

    def allowed(self) -> list[int]:
        if self.done:
            return [self.c.eos]
        if self.queue:
            return [self.queue[0]]
        name = self.column
        if name in self.fixed:  # its value was forced: only the next segment may follow
            return [self.c.next_segment(self.order, self.pos)[0]]
        if name in self.c.tries:
            ids = list((self.node or self.c.tries[name]).children)
        else:
            ids = list(self.c.number_extensions(name, self.text))
        if self._value_complete():
            ids.append(self.c.next_segment(self.order, self.pos)[0])
        return ids

    def consume(self, token: int) -> None:
        if self.done:
            return
        if self.queue:
            if token != self.queue[0]:
                raise RuntimeError("constrained decoding: a forced token was not emitted")
            self.queue.pop(0)
            return
        name = self.column
        nxt = self.c.next_segment(self.order, self.pos)
        if self._value_complete() and token == nxt[0]:
            if self.pos == len(self.order) - 1:
                self.done = True
                return
            self.pos += 1
            self.node, self.text = None, ""
            self.queue = list(nxt[1:]) + self._fixed_value(self.order[self.pos])
            return
        if name in self.c.tries:
            node = self.node or self.c.tries[name]
            if token not in node.children:
                raise RuntimeError("constrained decoding: token outside the category trie")
            self.node = node.children[token]
        else:
            self.text += self.c.tokenizer.decode([token], clean_up_tokenization_spaces=False)


class ConstrainedRowProcessor(LogitsProcessor):
    """Masks every token that would break the row format; one ``RowState`` per batch row.

    ``orders[i]`` is the column order of batch row i, ``fixed[i]`` its forced categorical values (or
    None). ``record_logits_for`` names columns whose raw
    logits at the first value token are kept (``states[i].value_start_logits``), e.g. the target,
    so fairness-aware generation can read the generator's P(Y | row so far) without re-scoring.
    """

    def __init__(self, constraint: RowConstraint, orders: Sequence[Sequence[str]], record_logits_for: Sequence[str] = (),
                 fixed: Sequence[dict[str, str] | None] | None = None):
        self.constraint = constraint
        fixed = list(fixed) if fixed is not None else [None] * len(orders)
        if len(fixed) != len(orders):
            raise ValueError(f"{len(orders)} column orders but {len(fixed)} fixed-value maps")
        self.states = [RowState(constraint, o, f) for o, f in zip(orders, fixed)]
        self.record = set(record_logits_for)
        self._prompt_len: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[0] != len(self.states):
            raise ValueError(f"batch has {input_ids.shape[0]} rows but {len(self.states)} column orders were given")
        if self._prompt_len is None:
            self._prompt_len = input_ids.shape[1]
        else:
            last = input_ids[:, -1].tolist()
            for st, tok in zip(self.states, last):
                st.consume(int(tok))
        keep = torch.zeros_like(scores, dtype=torch.bool)
        for i, st in enumerate(self.states):
            if st.in_value and st.column in self.record and st.node is None and st.text == "":
                st.value_start_logits.setdefault(st.column, scores[i].detach().float().clone())
            keep[i, st.allowed()] = True
        return scores.masked_fill(~keep, float("-inf"))
