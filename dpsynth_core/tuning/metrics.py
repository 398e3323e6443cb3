"""Which of a pipeline's metrics a private sweep may rank trials by.

DP hyperparameter selection (Papernot & Steinke 2022) releases the best of K DP trials; the
guarantee assumes the score that picks the best is itself DP or computed without private data.
MAUVE or a downstream accuracy against held-out *private* texts, a d_JS against the *real*
attributes, a TSTR on the private sample, the DP-SGD loss on private batches: all read private
records, un-noised, so ranking by them leaks. A score computed on the synthetic output alone
(IFAcc of synthetic texts against their own synthetic attributes, with a zero-shot extractor
built from the public schema) is post-processing of DP outputs and costs nothing.

``METRIC_PRIVACY[pipeline]`` lists ``(pattern, privacy)`` pairs in the flattened ``metrics.json``
names the sweep reports (``ifacc.after_rl``); the first matching pattern wins. A metric that no
pattern names reads private data until someone declares otherwise here: unknown is refused.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Literal

from dpsynth_core.errors import ConfigError

MetricPrivacy = Literal["private-free", "reads private data"]
PRIVATE_FREE: MetricPrivacy = "private-free"
READS_PRIVATE: MetricPrivacy = "reads private data"

METRIC_PRIVACY: dict[str, tuple[tuple[str, MetricPrivacy], ...]] = {
    "actg": (
        # IFAcc: zero-shot extractor (public schema, public model) on synthetic texts vs the
        # synthetic AIM attributes they were conditioned on -- DP outputs only
        ("ifacc.plain_sampling", PRIVATE_FREE),
        ("ifacc.best_of_n", PRIVATE_FREE),
        ("ifacc.after_rl", PRIVATE_FREE),
        ("ifacc.after_rl_per_field.*", PRIVATE_FREE),
        # RL rewards are IFAcc of the policy's synthetic samples; synthetic_stats are text statistics
        ("anchored_rl.reward_*", PRIVATE_FREE),
        ("synthetic_stats.*", PRIVATE_FREE),
        # everything compared with real texts or attributes, or measured on private batches
        ("mauve.*", READS_PRIVATE),
        ("downstream.*", READS_PRIVATE),
        ("text_attribute_djs_1way.*", READS_PRIVATE),
        ("features.*", READS_PRIVATE),
        ("real_stats.*", READS_PRIVATE),
        ("dp_generator.*", READS_PRIVATE),
        ("n_real_eval", READS_PRIVATE),
    ),
    # DPFairLLM's evaluation (TSTR, fairness gaps, DCR / membership inference, the reference
    # row) is trained or tested on the real sample: nothing to rank a private sweep by.
    "dpfair": (("*", READS_PRIVATE),),
    # PE / WASP: accuracy, FID and MAUVE are against the private test split; the voting
    # history is per-iteration owner-side diagnostics.
    "wasp": (("*", READS_PRIVATE),),
    "augpe": (("*", READS_PRIVATE),),
}


def metric_privacy(pipeline: str, metric: str) -> MetricPrivacy:
    """``private-free`` or ``reads private data`` (the default for names not declared)."""
    for pattern, privacy in METRIC_PRIVACY.get(pipeline, ()):
        if fnmatchcase(metric, pattern):
            return privacy
    return READS_PRIVATE


def private_free_metrics(pipeline: str) -> list[str]:
    """The declared patterns a private sweep of ``pipeline`` may rank by."""
    return [p for p, privacy in METRIC_PRIVACY.get(pipeline, ()) if privacy == PRIVATE_FREE]


def check_private_ranking_metric(pipeline: str, metric: str) -> None:
    """Refuse a private sweep ranked by a metric that reads private data."""
    if metric_privacy(pipeline, metric) == PRIVATE_FREE:
        return
    allowed = private_free_metrics(pipeline)
    hint = f"metrics computed without private data: {', '.join(allowed)}" if allowed else (
        f"{pipeline} has no metric computed without private data; tune on a public/proxy data set "
        "(privacy.data: public)")
    raise ConfigError(
        f"refusing a DP sweep ranked by '{metric}': it reads private data (not DP), so choosing the "
        f"best trial by it leaks; {hint}"
    )
