"""Best-of-N on a Serve app without Ray in the library (issue 36): the Ray driver passes the Serve
client in as a callable (``ray_jobs.actg.serve_best_of_n``), as PE's drivers pass ``make_llms``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dpsynth_core.actg.best_of_n import IFACC_SCORER, best_of_n_on_serve
from dpsynth_core.errors import ConfigError


def test_the_request_names_the_ifacc_scorer_and_the_result_keeps_the_serve_choice():
    sent = {}

    def fake_serve(app: str, request: dict) -> list:
        sent.update(app=app, **request)
        return [SimpleNamespace(candidates=[f"{p} a", f"{p} b"], scores=[0.2, 0.9], best_index=1)
                for p in request["prompts"]]

    rows = [{"topic": "mouse"}, {"topic": "yeast"}]
    result = best_of_n_on_serve(fake_serve, "gen", ["p0", "p1"], rows, n=2, schema_path="schema.yaml",
                                extractor_config={"kind": "supervised"}, max_new_tokens=8, temperature=1.0,
                                top_p=0.9, seed=3)
    assert sent["app"] == "gen" and sent["scorer"] == IFACC_SCORER and sent["n"] == 2 and sent["seed"] == 3
    assert sent["metadata"] == [{"attributes": r, "schema": "schema.yaml", "extractor": {"kind": "supervised"}}
                                for r in rows]
    assert result.best_texts == ["p0 b", "p1 b"] and result.best_scores == [0.9, 0.9]
    assert result.anchors()[1] == {"attributes": {"topic": "yeast"}, "text": "p1 b", "ifacc": 0.9}


def test_an_in_process_run_with_a_serve_app_is_refused_before_anything_is_written(tmp_path):
    from dpsynth_core.actg.pipeline import ActgConfig, run_pipeline

    cfg = ActgConfig.model_validate({"best_of_n": {"serve_app": "gen"}, "output_dir": str(tmp_path / "run")})
    with pytest.raises(ConfigError, match="best_of_n.serve_app 'gen'.*Ray driver"):
        run_pipeline(cfg)
    assert not (tmp_path / "run").exists()


def test_the_drivers_serve_client_sends_a_request_serving_accepts(monkeypatch):
    from ray import serve

    from ray_jobs.actg import serve_best_of_n
    from serving.schemas import BestOfNRequest, BestOfNResult

    received = []

    class BestOfNMethod:
        def remote(self, request):
            received.append(request)
            best = [BestOfNResult(best="b", best_index=1, best_score=0.9, candidates=["a", "b"], scores=[0.1, 0.9])]
            return SimpleNamespace(result=lambda: best)

    monkeypatch.setattr(serve, "get_app_handle", lambda app: SimpleNamespace(best_of_n=BestOfNMethod()))
    result = best_of_n_on_serve(serve_best_of_n, "gen", ["p"], [{"topic": "mouse"}], n=2, schema_path="s.yaml",
                                extractor_config={}, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=0)
    assert isinstance(received[0], BestOfNRequest) and received[0].scorer == IFACC_SCORER
    assert result.best_texts == ["b"] and result.scores == [[0.1, 0.9]]
