"""WASP loads each PLM's engine once per run and keeps it across the iterations (a vLLM engine
costs ~10-30 s to load per PLM): a 2-iteration tiny run with two PLMs counts the loads."""

from __future__ import annotations

import json

import yaml

import dpsynth_core.engines as engines


def test_each_plm_engine_loads_once_and_serves_every_iteration(biorxiv_csv, tmp_path, monkeypatch):
    from ray_jobs import wasp

    loads, generations, closes = [], {}, []
    real_load = engines.load_engine

    def counting_load(config):
        engine = real_load(config)
        loads.append(config.model)
        key, generate, close = len(loads), engine.generate, engine.close

        def counted_generate(*args, **kwargs):
            generations[key] = generations.get(key, 0) + 1
            return generate(*args, **kwargs)

        def counted_close():
            closes.append(key)
            return close()

        engine.generate, engine.close = counted_generate, counted_close
        return engine

    monkeypatch.setattr(engines, "load_engine", counting_load)
    plm = {"model": "tiny-llama", "backend": "hf", "temperature": 1.0, "batch_size": 8}
    config = {
        "method": "wasp", "run_dir": str(tmp_path / "run"),
        "data": {"source": "biorxiv", "classes": ["neuroscience", "bioinformatics"], "num_private": 8, "num_test": 0},
        "plms": [{**plm, "name": "tiny-a", "seed": 1}, {**plm, "name": "tiny-b", "seed": 2}],
        "epsilon": 4.0, "iterations": 2, "num_synthetic": 12, "q": 1, "select_per_class": 2,
        "max_new_tokens": 4, "seed": 0, "evaluate": False,
    }
    path = tmp_path / "wasp.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    run_dir = wasp.main(path)

    history = json.loads((run_dir / "metrics.json").read_text())["history"]
    assert [r["iteration"] for r in history] == [0, 1, 2]  # the initial round and 2 DP iterations ran
    assert len(loads) == 2  # one engine per PLM for the whole run, not one per iteration
    # both engines generated, over the 3 rounds together (a round may give a PLM no prompts: its weight)
    assert sorted(generations) == [1, 2] and sum(generations.values()) >= 3
    assert sorted(closes) == [1, 2]  # and each closed once, at the end
