"""The headline figures of a finished ACTG run, as `make demo` prints them after the ledger.

Reads only ``metrics.json`` (aggregates over synthetic texts and held-out real texts; no record).
"""

from __future__ import annotations

import json
from pathlib import Path


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _mauve(mauve: dict) -> str:
    """MAUVE with its sample sizes, or "not enough texts" below the measured minimum (docs/report.md)."""
    if not mauve:
        return "MAUVE not computed"
    n = f"(n = {mauve.get('n_synthetic')} synthetic, {mauve.get('n_real')} real)"
    if mauve.get("mauve") is None:
        return f"MAUVE {mauve.get('status', 'not computed')} {n}, minimum {mauve.get('min_texts')}"
    sd = mauve.get("sd_over_kmeans_seeds")
    return f"MAUVE {_f(mauve['mauve'])}" + (f" ± {_f(sd)}" if sd is not None else "") + f" {n}"


def _system_line(name: str, s: dict) -> str:
    down = s.get("downstream") or {}
    parts = [f"{name}: {s.get('n_texts', 0)} texts",
             f"IFAcc judge {_f(s.get('ifacc_judge'))} / reward {_f(s.get('ifacc_reward'))}",
             f"d_JS(text attributes, 1-way) {_f((s.get('djs_text') or {}).get('1way_mean'))}",
             _mauve(s.get("mauve") or {})]
    if down:  # each figure beside its trivial baseline on the same metric
        parts.append(f"downstream (n = {down.get('n_train')} train, {down.get('n_test')} test) accuracy "
                     f"{_f(down.get('accuracy'))} (majority class {_f(down.get('majority_baseline'))}), macro-F1 "
                     f"{_f(down.get('macro_f1'))} (constant predictor {_f(down.get('constant_macro_f1'))})")
    return "  " + "; ".join(parts)


def summarize(run_dir: Path) -> str:
    m = json.loads((Path(run_dir) / "metrics.json").read_text())
    lines = [f"run {m['name']} ({m['mode']}): graded on {m['n_real_eval']} held-out real texts; "
             f"judge: {m.get('judge', 'n/a')}; reward: {m.get('reward', 'n/a')}"]
    if m.get("not_private"):
        lines.append("NOT PRIVATE: a reference run (epsilon = inf); nothing here may be released as DP")
    for name, system in (m.get("systems") or {}).items():
        lines.append(_system_line(name, system))
    if "ifacc" in m:
        i = m["ifacc"]
        lines.append(f"IFAcc (reward) on {i.get('graded_on', 'the eval pool')}: plain {_f(i.get('plain_sampling'))} | "
                     f"best-of-{i.get('best_of_n_n')} {_f(i.get('best_of_n'))} | after RL {_f(i.get('after_rl'))}")
    if "features" in m:
        ft = m["features"]
        lines.append(f"feature table ({ft.get('generator', 'aim')}) d_JS vs real attributes: "
                     f"1-way {_f(ft.get('djs_1way_mean'))}, 2-way {_f(ft.get('djs_2way_mean'))}")
    real = m.get("real_stats") or {}
    synth = m.get("synthetic_stats") or {}
    if real and synth:
        lines.append(f"synthetic length {synth['mean_words']:.1f} words (real {real['mean_words']:.1f}); "
                     f"distinct-2 {_f(synth.get('distinct_2'))}")
    led = m["ledger"]
    if m.get("not_private"):
        lines.append("privacy: none (epsilon = inf, marked not private in the ledger and the release)")
    else:
        lines.append(f"privacy: epsilon {led['total_epsilon']:.3f} of {led['epsilon_budget']} at delta {led['delta']:.2e}")
    lines.append(f"metrics: {Path(run_dir) / 'metrics.json'}   plots: {Path(run_dir) / 'plots'}/")
    return "\n".join(lines)
