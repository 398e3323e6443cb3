"""Fidelity: how close the synthetic data is to the real data (owner-side: it reads real rows)."""

from __future__ import annotations

from dpsynth_core.data.sample_sizes import MAUVE_MIN_TEXTS, NOT_ENOUGH_TEXTS, enough_for_mauve, mauve_not_enough
from dpsynth_core.report.bands import djs_grade, mauve_grade, tvd_grade
from dpsynth_core.report.inputs import RunFacts
from dpsynth_core.report.model import NOT_COMPUTED, Figure, Section, Table, fmt, not_applicable, not_computed
from dpsynth_core.report.svg import heatmap, paired_bars

TITLE = "Fidelity"
MAIN_SYSTEMS = ("actg_arl", "direct_prompt", "vanilla", "actg")  # ACTG's published system, first present


def main_system(metrics: dict) -> str | None:
    systems = metrics.get("systems") or {}
    return next((s for s in MAIN_SYSTEMS if s in systems), None)


def gated(mauve: dict | None) -> dict:
    """A run's MAUVE entry, or "not enough texts" when either side is below the minimum (a run from before the rule
    may hold a number computed on a handful of texts: it is not shown)."""
    mauve = mauve or {}
    n_real, n_synth = mauve.get("n_real"), mauve.get("n_synthetic")
    if mauve.get("mauve") is not None and n_real is not None and n_synth is not None \
            and not enough_for_mauve(n_real, n_synth):
        return mauve_not_enough(n_real, n_synth)
    return mauve


def mauve_text(mauve: dict | None) -> str:
    """MAUVE as printed everywhere: mean ± sd over k-means seeds, or "not enough texts"."""
    if not mauve:
        return "not computed"
    if mauve.get("mauve") is None:
        return f"{mauve.get('status', NOT_ENOUGH_TEXTS)} (minimum {mauve.get('min_texts', MAUVE_MIN_TEXTS)})"
    sd = mauve.get("sd_over_kmeans_seeds")
    return f"{mauve['mauve']:.3f}" + (f" ± {sd:.3f}" if sd is not None else "")


def _actg(facts: RunFacts) -> Section:
    m = facts.metrics or {}
    n_real = m.get("n_real_eval")
    real = m.get("real_stats") or {}
    rows, main = [], main_system(m)
    for name, s in (m.get("systems") or {}).items():
        djs = (s.get("djs_text") or {}).get("1way_mean")
        same = (s.get("djs_text_same_reader") or {}).get("1way_mean")
        stats = s.get("stats") or {}
        rows.append([name, str(s.get("n_texts")), str(n_real), mauve_text(gated(s.get("mauve"))), fmt(djs), fmt(same),
                     f"{fmt(stats.get('mean_words'), 1)} (real {fmt(real.get('mean_words'), 1)})",
                     f"{fmt(stats.get('distinct_2'))} (real {fmt(real.get('distinct_2'))})"])
    tables = [Table("Synthetic texts against held-out real texts", ["system", "n synthetic", "n real", "MAUVE",
                    "d_JS 1-way (judge vs oracle)", "d_JS 1-way (same reader)", "mean words", "distinct-2"], rows)]
    figures, grade, action = [], None, "none"
    s = (m.get("systems") or {}).get(main) or {}
    n = f"{s.get('n_texts')} synthetic, {n_real} real texts"
    mauve = gated(s.get("mauve"))
    figures.append(Figure(f"MAUVE ({main})", mauve_text(mauve) if mauve else "not computed", n))
    djs = (s.get("djs_text_same_reader") or s.get("djs_text") or {}).get("1way_mean")
    if djs is not None:
        figures.append(Figure(f"attribute d_JS 1-way ({main}, base e)", djs, n))
    features = m.get("features") or {}
    if features.get("djs_1way_mean") is not None:
        figures.append(Figure("DP feature table: d_JS 1-way vs real attributes", features["djs_1way_mean"],
                              f"{features.get('rows', 'n/a')} synthetic rows"))
    if mauve.get("mauve") is not None:
        grade = mauve_grade(mauve["mauve"])
    elif djs is not None:
        grade = djs_grade(djs)
    if mauve and mauve.get("mauve") is None:
        action = (f"generate at least {mauve.get('min_texts', MAUVE_MIN_TEXTS)} texts (and hold out as many real "
                  "ones) to measure MAUVE")
    if grade is None:
        return Section("fidelity", TITLE, NOT_COMPUTED, action, figures, tables,
                       notes=["graded on MAUVE or attribute d_JS; the run has neither"])
    return _graded(grade, action, figures, tables, [])


def _pe(facts: RunFacts) -> Section:
    ev = (facts.metrics or {}).get("evaluation")
    if not ev:
        return not_computed("fidelity", TITLE, "the run had no held-out real texts to compare with (evaluate: false)")
    n = f"{ev.get('n_train')} synthetic, {ev.get('n_test')} real texts"
    if ev.get("mauve") is None:
        status = ev.get("mauve_status") or ev.get("mauve_error") or "not computed"
        mauve = {"mauve": None, "status": status, "min_texts": ev.get("mauve_min_texts", MAUVE_MIN_TEXTS)}
    else:
        mauve = gated({"mauve": ev["mauve"], "n_real": ev.get("n_test"), "n_synthetic": ev.get("n_train")})
    figures = [Figure("MAUVE", mauve_text(mauve), n), Figure("FID (MiniLM embeddings; lower is closer)", ev.get("fid"), n)]
    if mauve["mauve"] is None:
        return Section("fidelity", TITLE, NOT_COMPUTED, f"generate at least {MAUVE_MIN_TEXTS} texts (and hold out "
                       "as many real ones) to measure MAUVE", figures)
    return _graded(mauve_grade(mauve["mauve"]), "none", figures, [], [])


def _table(facts: RunFacts) -> Section:
    ev = facts.evaluation
    if not ev or "fidelity" not in ev:
        return not_computed("fidelity", TITLE, "no eval/report.json in the run directory")
    fid = ev["fidelity"]
    n = f"{ev.get('n_synthetic')} synthetic rows, {ev.get('n_real_train', 'n/a')} real rows"
    figures = [Figure("mean 1-way TVD (column shapes)", fid["tvd_1way_mean"], n),
               Figure("mean 2-way TVD (pair trends)", fid["tvd_2way_mean"], n),
               Figure("mean 1-way JSD (base 2)", fid.get("jsd_1way_mean"), n)]
    one = fid.get("tvd_1way") or {}
    tables = [Table("Column shapes: TVD / JSD of each column's distribution", ["column", "TVD", "JSD"],
                    [[c, fmt(v), fmt((fid.get("jsd_1way") or {}).get(c))] for c, v in one.items()])]
    worst = sorted((fid.get("tvd_2way") or {}).items(), key=lambda kv: -kv[1])[:10]
    tables.append(Table("Pair trends: the 10 column pairs furthest from real (2-way TVD)", ["pair", "TVD"],
                        [[p.replace("|", " × "), fmt(v)] for p, v in worst]))
    charts = [paired_bars("1-way TVD per column", list(one), {"TVD": list(one.values())})] if one else []
    for col, shares in (ev.get("marginals") or {}).items():
        charts.append(paired_bars(f"{col}: real vs synthetic", [str(v) for v in shares["values"]],
                                  {"real": shares["real"], "synthetic": shares["synthetic"]}, height=120))
    assoc = ev.get("associations")
    if assoc:
        cols = assoc["columns"]
        gaps = [abs(r - s) for rr, ss in zip(assoc["real"], assoc["synthetic"]) for r, s in zip(rr, ss)]
        figures.append(Figure("mean |Cramér's V real − synthetic| over column pairs", sum(gaps) / max(1, len(gaps) - len(cols)), n))
        charts += [heatmap(f"Column associations, real (Cramér's V, n = {ev.get('n_real_train', 'n/a')})", cols, assoc["real"]),
                   heatmap(f"Column associations, synthetic (Cramér's V, n = {ev.get('n_synthetic')})", cols,
                           assoc["synthetic"])]
    grade = tvd_grade(fid["tvd_1way_mean"])
    action = {"D": "more ε for the generator, or more training steps",
              "C": "check the column-shape table for the worst marginal"}.get(grade, "none")
    return _graded(grade, action, figures, tables, charts)


def _graded(grade: str, action: str, figures, tables, charts) -> Section:
    if grade == "D" and action == "none":
        action = "more ε for the generator, or more training steps"
    elif grade == "C" and action == "none":
        action = "check the per-attribute / per-column table for the worst marginal"
    return Section("fidelity", TITLE, grade, action, figures, tables, charts)


def fidelity_section(facts: RunFacts) -> Section:
    if facts.method == "train":
        return not_applicable("fidelity", TITLE, "a `dpsynth train` run releases an adapter, no synthetic data")
    if facts.method == "ACTG":
        return _actg(facts)
    if facts.is_text:
        return _pe(facts)
    return _table(facts)
