"""Best-of-N: N candidates per synthetic attribute row, scored by IFAcc, the best one kept.

    result = select_best(candidates, attribute_rows, extractor)   # candidates[i][j]
    result.anchors            # [{"prompt_attributes": row, "text": best, "ifacc": score}, ...]
    result.plain_ifacc        # mean IFAcc of candidate 0 (= plain sampling, one sample per row)
    result.best_ifacc         # mean IFAcc of the kept candidates

The kept rows form the SFT anchor set of Anchored RL. Everything here is post-processing of the
DP generator's output and of the DP (AIM) attribute table: it sees no private record and costs
nothing; :func:`record_post_processing` writes the zero-cost event to the ledger.

Locally the candidates come from :func:`dpsynth_core.actg.generator.generate_texts` in-process.
With a running Ray Serve generation app (``best_of_n.serve_app``), :func:`best_of_n_on_serve` sends
the prompts to its ``BestOfN`` deployment with :func:`ifacc_scorer` as the scorer instead, through a
:data:`ServeBestOfN` callable that the Ray driver passes in (``ray_jobs.actg.serve_best_of_n``), as
PE's drivers pass ``make_llms``: the library itself imports neither Ray nor ``serving``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dpsynth_core.errors import DataError


@dataclass
class BestOfNResult:
    """Per row: every candidate and its IFAcc, the index of the best one."""

    attribute_rows: list[dict[str, str]]
    candidates: list[list[str]]
    scores: list[list[float]]
    best_index: list[int] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.candidates[0]) if self.candidates else 0

    @property
    def best_texts(self) -> list[str]:
        return [c[j] for c, j in zip(self.candidates, self.best_index)]

    @property
    def best_scores(self) -> list[float]:
        return [s[j] for s, j in zip(self.scores, self.best_index)]

    @property
    def plain_ifacc(self) -> float:
        """Mean IFAcc of the first candidate of each row: plain sampling, one sample per row."""
        return _mean([s[0] for s in self.scores])

    @property
    def mean_candidate_ifacc(self) -> float:
        """Mean IFAcc over all candidates (a lower-variance estimate of plain sampling)."""
        return _mean([x for s in self.scores for x in s])

    @property
    def best_ifacc(self) -> float:
        return _mean(self.best_scores)

    def anchors(self) -> list[dict]:
        """The SFT anchor set: one record per row, ``{"attributes", "text", "ifacc"}``."""
        return [{"attributes": a, "text": t, "ifacc": s}
                for a, t, s in zip(self.attribute_rows, self.best_texts, self.best_scores)]

    def summary(self) -> dict:
        return {"n": self.n, "rows": len(self.candidates), "plain_ifacc": self.plain_ifacc,
                "mean_candidate_ifacc": self.mean_candidate_ifacc, "best_of_n_ifacc": self.best_ifacc}


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else float("nan")


def select_best(candidates: Sequence[Sequence[str]], attribute_rows: Sequence[dict[str, str]],
                extractor) -> BestOfNResult:
    """Score every candidate against its row's attributes with ``extractor.ifacc`` (one batched
    call) and keep the best; ties go to the earliest candidate (so N=1 is plain sampling)."""
    if len(candidates) != len(attribute_rows):
        raise DataError(f"best-of-n: {len(candidates)} candidate lists but {len(attribute_rows)} attribute rows")
    widths = {len(c) for c in candidates}
    if len(widths) > 1 or 0 in widths:
        raise DataError(f"best-of-n: every row needs the same number (>= 1) of candidates, got {sorted(widths)}")
    flat_texts = [t for c in candidates for t in c]
    flat_targets = [a for c, a in zip(candidates, attribute_rows) for _ in c]
    flat_scores = extractor.ifacc(flat_texts, flat_targets) if flat_texts else []
    n = widths.pop() if widths else 0
    scores = [list(flat_scores[i * n:(i + 1) * n]) for i in range(len(candidates))]
    best = [max(range(n), key=lambda j, s=s: (s[j], -j)) for s in scores]
    return BestOfNResult(attribute_rows=[dict(a) for a in attribute_rows],
                         candidates=[list(c) for c in candidates], scores=scores, best_index=best)


def record_post_processing(ledger, stage: str, details: dict | None = None, *, once: bool = True) -> float:
    """Zero-cost ledger entry: this stage only saw DP outputs (synthetic attributes, generator).
    ``once``: a resumed stage that already has its entry does not get a second one."""
    from dpsynth_core.privacy import PostProcessingEvent

    if once and any(e.stage == stage for e in ledger.entries()):
        return ledger.total_epsilon()
    return ledger.record(stage, PostProcessingEvent(), details=details)


# ---------------------------------------------------------------------------------------------
# Ray Serve path: the BestOfN deployment calls scorer(prompt, completion, metadata) -> float
# ---------------------------------------------------------------------------------------------
_SCORER_CACHE: dict[tuple, object] = {}


def ifacc_scorer(prompt: str, completion: str, metadata: dict) -> float:
    """Serve-side scorer: IFAcc of ``completion`` against ``metadata["attributes"]``.

    ``metadata`` also names the schema file (``schema``) and the extractor kind/model
    (``extractor``); the extractor is built once per replica and cached.
    """
    from dpsynth_core.actg.extractors import ExtractorConfig, build_extractor
    from dpsynth_core.actg.schema import load_schema

    key = (metadata["schema"], repr(sorted(metadata.get("extractor", {}).items())))
    if key not in _SCORER_CACHE:
        schema = load_schema(metadata["schema"])
        _SCORER_CACHE[key] = build_extractor(ExtractorConfig.model_validate(metadata.get("extractor", {})), schema)
    return float(_SCORER_CACHE[key].ifacc([completion], [metadata["attributes"]])[0])


# (Serve app name, BestOfNRequest fields) -> per prompt a result with .candidates, .scores, .best_index
ServeBestOfN = Callable[[str, dict], Sequence]
IFACC_SCORER = "dpsynth_core.actg.best_of_n:ifacc_scorer"


def best_of_n_on_serve(serve_best_of_n: ServeBestOfN, app: str, prompts: Sequence[str],
                       attribute_rows: Sequence[dict[str, str]], *, n: int, schema_path: str, extractor_config: dict,
                       max_new_tokens: int, temperature: float, top_p: float, seed: int) -> BestOfNResult:
    """Best-of-N through the ``BestOfN`` deployment of the running Serve app ``app``: generation and
    IFAcc scoring happen on its replicas; returns the same :class:`BestOfNResult`."""
    metadata = [{"attributes": dict(a), "schema": str(schema_path), "extractor": dict(extractor_config)}
                for a in attribute_rows]
    request = {"prompts": list(prompts), "n": n, "metadata": metadata, "scorer": IFACC_SCORER,
               "max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "seed": seed}
    results = serve_best_of_n(app, request)
    return BestOfNResult(attribute_rows=[dict(a) for a in attribute_rows],
                         candidates=[list(r.candidates) for r in results],
                         scores=[list(r.scores) for r in results],
                         best_index=[int(r.best_index) for r in results])
