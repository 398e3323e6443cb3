"""ACTG stages after the DP outputs exist: reward model, generate, Best-of-N, Anchored RL, synthesize.

None of them reads a private record. ``reward_model`` reads only the declared-public labeled
file (``data.public_path``); the others read DP outputs (features.csv, the DP adapter) and their own
post-processed files. Each takes ``(config, run_dir)`` and returns a small JSON summary.
The synthetic rows are split into disjoint pools (:mod:`dpsynth_core.actg.pools`): anchor rows
feed Best-of-N, rl rows are the RL prompts, eval rows are only ever generated for evaluation.
"""

from __future__ import annotations

from pathlib import Path

from dpsynth_core.actg.run_files import (
    RunDir,
    generator_prompts,
    load_run_schema,
    read_jsonl,
    set_torch_threads,
    synthetic_rows,
    write_jsonl,
)
from dpsynth_core.errors import ConfigError


def serve_app_needs_the_driver(app: str) -> str:
    return (f"best_of_n.serve_app '{app}': Best-of-N on a Serve app runs under the Ray driver (`dpsynth run actg`), "
            "which passes the Serve client in; an in-process run scores its candidates itself (leave serve_app unset)")


def _ctx(cfg, root: str):
    set_torch_threads(cfg)
    rd = RunDir(Path(root))
    return rd, load_run_schema(cfg, rd.root)


def pooled_rows(cfg, rd) -> list[tuple[str, dict]]:
    """(pool, attribute row) for every synthetic row of features.csv."""
    from dpsynth_core.actg.pools import pool_labels

    rows = synthetic_rows(cfg, rd)
    return list(zip(pool_labels(len(rows), cfg.features.anchor_share, cfg.features.rl_share), rows))


def rows_of(cfg, rd, pool: str) -> list[dict]:
    return [r for p, r in pooled_rows(cfg, rd) if p == pool]


def stage_reward_model(cfg, root: str) -> dict:
    """Fit the supervised reward on the PUBLIC labeled rows only (never the private pool)."""
    from dpsynth_core.actg.data_split import load_public_labeled
    from dpsynth_core.actg.supervised import EXTRACTOR_C, SupervisedExtractor, labeled_rows

    reward = cfg.reward or cfg.extractor
    supervised = next((e for e in (reward, cfg.extractor) if e.kind == "supervised"), None)
    if supervised is None:
        return {"kind": reward.kind}
    rd, schema = _ctx(cfg, root)
    texts, rows = labeled_rows(load_public_labeled(cfg), schema, cfg.data.text_col)
    texts = [t[: cfg.data.max_chars] for t in texts]
    SupervisedExtractor.fit(texts, rows, schema, features="embedding", embedder=supervised.model or "minilm",
                            c=EXTRACTOR_C).save(rd.reward_model)
    record_public_data_use(cfg, rd.root, len(texts))
    return {"kind": "supervised", "public_rows": len(texts), "features": "embedding"}


PUBLIC_DATA_STAGE = "public_labeled_data"


def record_public_data_use(cfg, root: Path, rows: int) -> None:
    """The ledger shows the public labeled file as a zero-epsilon use (no record of the private file,
    ``data_split.py``), so a reader of the ledger / release sees that public data was used."""
    from dpsynth_core.privacy import PostProcessingEvent, PrivacyLedger

    ledger = PrivacyLedger.open(root)
    if any(e.stage == PUBLIC_DATA_STAGE for e in ledger.entries()):
        return
    ledger.record(PUBLIC_DATA_STAGE, PostProcessingEvent(), details={
        "what": "a separate labeled file the owner declares public (data.public_path) trains the supervised reward; "
                "zero epsilon: no record of the private file (data.path) is read, and the two files share none",
        "rows": rows, "epsilon": 0.0, "used_by": "reward_model"})


def stage_generate(cfg, root: str) -> dict:
    """N candidates per anchor row and one plain sample per eval row, from the DP generator."""
    import pandas as pd

    from dpsynth_core.actg.best_of_n import record_post_processing
    from dpsynth_core.actg.generator import generate_texts, open_generator
    from dpsynth_core.config.placement import resolve_placement
    from dpsynth_core.privacy import PrivacyLedger

    resolve_placement(cfg.generation.device, cfg.generation.dtype, section="generation.")  # before any file
    rd, schema = _ctx(cfg, root)
    anchor, rl, held = (rows_of(cfg, rd, p) for p in ("anchor", "rl", "eval"))
    pd.DataFrame(rl, columns=schema.field_names).to_csv(rd.rl_prompts, index=False)
    adapter = Path(rd.summary("dp_generator")["adapter_dir"])
    n = cfg.best_of_n.n
    summary = {"anchor_rows": len(anchor), "rl_rows": len(rl), "eval_rows": len(held), "n": n}
    with open_generator(cfg.dpsgd_config(1.0).model, adapter, cfg.generation) as engine:
        plain = [c[0] for c in generate_texts(engine, None, generator_prompts(cfg, rd, held, len(held)), cfg.generation, n=1,
                                              desc="plain samples for the eval pool")]
        if not cfg.best_of_n.serve_app:  # else the candidates are generated inside stage_best_of_n
            cands = generate_texts(engine, None, generator_prompts(cfg, rd, anchor, len(anchor)), cfg.generation, n=n,
                                   desc=f"generating {n} candidates per anchor row")
            write_jsonl(rd.candidates, [{"attributes": r, "candidates": c} for r, c in zip(anchor, cands)])
    write_jsonl(rd.plain_eval, [{"text": t, "attributes": r, "pool": "eval"} for t, r in zip(plain, held)])
    record_post_processing(PrivacyLedger.open(rd.root), "generate", summary)
    return summary


def stage_best_of_n(cfg, root: str, serve_best_of_n=None) -> dict:
    """Reward-score the anchor candidates, keep the best -> anchors.jsonl (post-processing). With
    ``best_of_n.serve_app``, a running Serve app generates and scores them through ``serve_best_of_n``
    (``best_of_n.ServeBestOfN``, passed in by the Ray driver)."""
    from dpsynth_core.actg.best_of_n import BestOfNResult, best_of_n_on_serve, record_post_processing, select_best
    from dpsynth_core.actg.extractors import build_extractor
    from dpsynth_core.config.placement import resolve_placement
    from dpsynth_core.privacy import PrivacyLedger

    reward = cfg.reward_config(root)
    resolve_placement(reward.device, reward.dtype, section="reward.")  # the scoring model's, before any file
    rd, schema = _ctx(cfg, root)
    if cfg.best_of_n.serve_app:
        if serve_best_of_n is None:
            raise ConfigError(serve_app_needs_the_driver(cfg.best_of_n.serve_app))
        rows = rows_of(cfg, rd, "anchor")
        g = cfg.generation
        result = best_of_n_on_serve(serve_best_of_n, cfg.best_of_n.serve_app, generator_prompts(cfg, rd, rows, len(rows)),
                                    rows, n=cfg.best_of_n.n, schema_path=str(rd.schema),
                                    extractor_config=reward.model_dump(), max_new_tokens=g.max_new_tokens,
                                    temperature=g.temperature, top_p=g.top_p, seed=g.seed)
    else:
        data = read_jsonl(rd.candidates)
        result = select_best([d["candidates"] for d in data], [d["attributes"] for d in data],
                             build_extractor(reward, schema))
    assert isinstance(result, BestOfNResult)
    write_jsonl(rd.anchors, result.anchors())
    record_post_processing(PrivacyLedger.open(rd.root), "best_of_n", result.summary())
    return result.summary()


def stage_anchored_rl(cfg, root: str) -> dict:
    """Anchored RL on the rl pool's rows only, from DP artifacts (anchored_rl.RLArtifacts)."""
    from dpsynth_core.actg.anchored_rl import RLArtifacts, run_anchored_rl
    from dpsynth_core.actg.best_of_n import record_post_processing
    from dpsynth_core.privacy import PrivacyLedger

    rd, _ = _ctx(cfg, root)
    artifacts = RLArtifacts(schema_path=rd.schema, attributes_path=rd.rl_prompts, anchors_path=rd.anchors,
                            base_model=cfg.dpsgd_config(1.0).model,
                            adapter_dir=Path(rd.summary("dp_generator")["adapter_dir"]),
                            prompt_template=cfg.template_text(), text_description=cfg.data.text_description,
                            extractor=cfg.reward_config(rd.root).model_dump())
    result = run_anchored_rl(artifacts, cfg.rl, rd.rl)
    h = result.history
    summary = {"adapter_dir": str(result.adapter_dir), "steps": len(h), "algorithm": "RLOO (trl)",
               "beta_kl": cfg.rl.beta,
               "reward_first": h[0]["reward"], "reward_last": h[-1]["reward"],
               "reward_mean": sum(r["reward"] for r in h) / len(h),
               "gamma_first": h[0]["gamma"], "gamma_last": h[-1]["gamma"]}
    record_post_processing(PrivacyLedger.open(rd.root), "anchored_rl", summary)
    return summary


def stage_synthesize(cfg, root: str) -> dict:
    """The released synthetic texts: one per synthetic attribute row from the final policy (after
    RL in ACTG mode, each tagged with its pool; the DP generator with unconditional prompts in
    vanilla mode)."""
    from dpsynth_core.actg.best_of_n import record_post_processing
    from dpsynth_core.actg.generator import generate_texts, open_generator
    from dpsynth_core.privacy import PrivacyLedger

    set_torch_threads(cfg)
    rd = RunDir(Path(root))
    base = cfg.dpsgd_config(1.0).model
    if cfg.mode == "actg":
        pooled = pooled_rows(cfg, rd)
        pools, rows = [p for p, _ in pooled], [r for _, r in pooled]
        # direct prompting: the base model itself, never trained
        adapter = None if cfg.generator_mode == "direct_prompt" else Path(rd.summary("anchored_rl")["adapter_dir"])
    else:
        rows, pools = None, None
        adapter = Path(rd.summary("dp_generator")["adapter_dir"])
    count = len(rows) if rows is not None else cfg.features.n_synthetic
    settings = cfg.generation.model_copy(update={"seed": cfg.generation.seed + 1})  # fresh samples
    with open_generator(base, adapter, settings) as engine:
        texts = [c[0] for c in generate_texts(engine, None, generator_prompts(cfg, rd, rows, count), settings, n=1,
                                              desc="synthesizing")]
    if rows is None:
        out = [{"text": t} for t in texts]
    else:
        out = [{"text": t, "attributes": r, "pool": p} for t, r, p in zip(texts, rows, pools)]
    write_jsonl(rd.synthetic, out)
    record_post_processing(PrivacyLedger.open(rd.root), "synthesize", {"texts": len(out)})
    return {"texts": len(out)}
