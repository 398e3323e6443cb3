"""Pipelines on a real two-node Ray cluster through `dpsynth submit` (no mocks).

A head (1 CPU) and a second node (1 CPU, one *logical* GPU) on this machine; run storage is a tmp
directory that is not the job's working directory. The default suite runs the cheap, meaningful
part (a GPU stage gets a GPU id; a relative run_dir in a job fails with its error line first;
one PE submission and its resume). ``DPSYNTH_CLUSTER_TESTS=full`` (``make test-cluster``) adds
ACTG and DPFairLLM submissions with resume and the node-kill test.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from ray_cluster import BIN, LocalCluster

REPO = Path(__file__).resolve().parent.parent
FULL = os.environ.get("DPSYNTH_CLUSTER_TESTS") == "full"
full_only = pytest.mark.skipif(not FULL, reason="opt-in: DPSYNTH_CLUSTER_TESTS=full (make test-cluster)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head + a second node declaring one logical GPU; yields (cluster, second node's process)."""
    c = LocalCluster(temp_dir=tmp_path_factory.mktemp("ray2"))
    try:
        c.start_head(num_cpus=1)
        second = c.add_node(num_cpus=1, num_gpus=1)
        yield c, second
    finally:
        c.stop()


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    """Shared run storage: every node (here: the same machine) and every later job can reach it."""
    return tmp_path_factory.mktemp("shared_storage")


def _gpu_node_id(c: LocalCluster) -> str:
    return next(n["node_id"] for n in c.alive_nodes() if n.get("resources_total", {}).get("GPU"))


def dpsynth(c: LocalCluster, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dpsynth"), *args], env=c.env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def submit(c: LocalCluster, data_dir: Path, *args: str, wait: bool = True) -> tuple[subprocess.CompletedProcess, str, float]:
    """`dpsynth submit` (the project as working_dir); returns (process, job id, wall seconds)."""
    t0 = time.perf_counter()
    out = dpsynth(c, "submit", "--address", c.address, "--working-dir", str(REPO),
                  "--env", f"DPSYNTH_DATA_DIR={data_dir}", *([] if wait else ["--no-wait"]), "--", *args)
    seconds = time.perf_counter() - t0
    assert "submitted " in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    job_id = out.stdout.split("submitted ", 1)[1].split(":", 1)[0]
    print(f"[cluster] {' '.join(args[:2])}: {job_id} rc={out.returncode} {seconds:.1f}s")
    return out, job_id, seconds


def ledger_rows(run_dir: Path) -> list[tuple]:
    with sqlite3.connect(run_dir / "ledger.sqlite") as conn:
        return conn.execute("SELECT id, stage, kind, params, epsilon_alone FROM events ORDER BY id").fetchall()


def _config(storage: Path, source: str, name: str, **update) -> Path:
    raw = yaml.safe_load((REPO / "configs" / source).read_text())
    raw.update(update)
    path = storage / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------- default
def test_gpu_stage_is_scheduled_with_a_gpu_id(cluster):
    """A stage configured with gpus: 1 asks Ray for it, lands on the GPU node and sees a GPU id;
    a stage asking for none sees no GPU; a request no node can hold is a clear error, not a hang."""
    c, _ = cluster
    probe = textwrap.dedent("""
        import json
        from dpsynth_core.actg.pipeline import ActgConfig
        from dpsynth_core.errors import ConfigError
        from ray_jobs.actg import ray_runner
        from ray_jobs.cluster import ensure_ray

        def stage_private(cfg, root):
            import os
            return {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

        def stage_generate(cfg, root):
            return {}

        ensure_ray()  # RAY_ADDRESS: joins the two-node cluster
        cfg = ActgConfig(resources={"stages": {"private": {"gpus": 1}}})
        out = {"private": ray_runner(stage_private, cfg, "/tmp"), "generate": ray_runner(stage_generate, cfg, "/tmp")}
        try:
            ray_runner(stage_generate, ActgConfig(resources={"gpus": 2}), "/tmp")
        except ConfigError as err:
            out["too_big"] = str(err)
        print("PROBE " + json.dumps(out))
    """)
    env = dict(c.env, RAY_ADDRESS=c.gcs_address)
    res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.split("PROBE ", 1)[1])
    gpu_node = _gpu_node_id(c)
    assert out["private"]["ran_on"]["gpu_ids"] == ["0"]
    assert out["private"]["ran_on"]["node_id"] == gpu_node
    assert out["private"]["cuda_visible_devices"] == "0"
    assert out["generate"]["ran_on"]["gpu_ids"] == []
    assert "stage 'generate' asks for" in out["too_big"] and "offers 1 CPU(s) and 1 GPU(s)" in out["too_big"]


def test_relative_run_dir_in_a_job_fails_with_its_error_line_first(cluster, shared_data_dir):
    """--no-wait returns with the job id; `jobs logs --follow` streams to the end; a failed job shows
    its error line (here: run_dir must be shared storage) before the traceback/logs."""
    c, _ = cluster
    out, job_id, _ = submit(c, shared_data_dir, "run", "augpe", "--config", "configs/augpe_tiny.yaml", wait=False)
    assert out.returncode == 0 and f"dpsynth jobs logs {job_id} --follow" in out.stdout
    follow = dpsynth(c, "jobs", "logs", job_id, "--follow", "--address", c.address, timeout=300)
    assert follow.returncode == 1
    assert "Running entrypoint" in follow.stdout  # streamed logs
    expected = "error: run_dir 'runs/augpe_tiny' is relative"
    assert f"{job_id}: FAILED: {expected}" in follow.stderr
    assert "set run_dir to shared storage (absolute path or URI" in follow.stderr
    logs = dpsynth(c, "jobs", "logs", job_id, "--address", c.address)
    assert logs.returncode == 1 and logs.stderr.splitlines()[0].startswith(f"{job_id}: FAILED: {expected}")
    status = dpsynth(c, "jobs", "status", job_id, "--address", c.address)
    assert status.stdout.splitlines() == ["FAILED", status.stdout.splitlines()[1]]
    assert status.stdout.splitlines()[1].startswith(f"error line: {expected}")


def _submit_twice_and_compare_ledgers(c, storage, data_dir, pipeline, source, vote_stage, **update):
    """Submit ``pipeline`` twice with run_dir in shared storage (a file:// URI): outputs and ledger
    land there; the second job resumes and records no new ledger event."""
    run_dir = storage / f"{pipeline}_tiny"
    cfg = _config(storage, source, f"{pipeline}_tiny", output_dir=f"file://{run_dir}", noise_seed=None, **update)
    first, job_id, _ = submit(c, data_dir, "run", pipeline, "--config", str(cfg))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert f"{job_id}: SUCCEEDED" in first.stdout and f"run directory: {run_dir}" in first.stdout
    for name in ("synthetic.jsonl", "metrics.json", "ledger.sqlite", "config.yaml"):
        assert (run_dir / name).is_file(), name
    charged = ledger_rows(run_dir)
    votes = [r for r in charged if r[1] == vote_stage]
    assert len(votes) == 1 and json.loads(votes[0][3])["compositions"] == 2, charged  # T=2 votes, recorded once
    second, _, _ = submit(c, data_dir, "run", pipeline, "--config", str(cfg))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert ledger_rows(run_dir) == charged  # the resume charged nothing twice
    attempts = json.loads((run_dir / "ran_on.json").read_text())["attempts"]  # where each submission ran
    assert len(attempts) == 2 and attempts[0]["vote_loop"]["host"]
    if any(p.get("node_id") for p in attempts[0]["plms"]):  # the driver used Ray (PLM actors / Serve)
        assert attempts[0]["vote_loop"]["node_id"] == _driver_node(c, job_id)
    return attempts


def test_augpe_submission_writes_to_storage_and_resubmission_charges_nothing(cluster, storage, shared_data_dir):
    c, _ = cluster
    _submit_twice_and_compare_ledgers(c, storage, shared_data_dir, "augpe", "augpe_tiny.yaml", "augpe.nn_vote")


# ----------------------------------------------------------------------------- opt-in (make test-cluster)
@full_only
def test_wasp_submission_writes_to_storage_and_resubmission_charges_nothing(cluster, storage, shared_data_dir):
    """WASP's two PLM actors (1 CPU each) fill both 1-CPU nodes."""
    c, _ = cluster
    attempts = _submit_twice_and_compare_ledgers(c, storage, shared_data_dir, "wasp", "wasp_tiny.yaml",
                                                 "wasp.topq_vote")
    alive = {n["node_id"] for n in c.alive_nodes()}
    assert {p["node_id"] for p in attempts[0]["plms"]} == alive  # one PLM actor on each node


def _driver_node(c: LocalCluster, job_id: str) -> str:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(c.address).get_job_info(job_id).driver_node_id


def _markers(run_dir: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (run_dir / "stages").glob("*.done")}


@full_only
def test_actg_submission_runs_dp_sgd_on_the_gpu_node_and_resumes(cluster, storage, shared_data_dir):
    """ACTG with its private (DP) stage asking for a GPU: that stage runs on the second node, the
    driver on the head; everything lands in storage; a resubmission charges nothing twice."""
    from dpsynth_core.actg.pipeline import STAGES_ACTG

    c, _ = cluster
    run_dir = storage / "actg_tiny"
    cfg = _config(storage, "actg_tiny.yaml", "actg_tiny", run_dir=str(run_dir),
                  resources={"stages": {"private": {"gpus": 1}}})
    first, job_id, _ = submit(c, shared_data_dir, "run", "actg", "--config", str(cfg))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    markers = _markers(run_dir)
    assert set(STAGES_ACTG) <= set(markers)
    gpu_node = _gpu_node_id(c)
    assert (markers["private"]["ran_on"]["node_id"], markers["private"]["ran_on"]["gpu_ids"]) == (gpu_node, ["0"])
    assert _driver_node(c, job_id) != gpu_node  # the job's driver ran on the head: two nodes took part
    for name in ("synthetic.jsonl", "metrics.json", "ledger.sqlite", "features.csv", "generator/adapter"):
        assert (run_dir / name).exists(), name
    charged = ledger_rows(run_dir)
    assert [r[1] for r in charged if r[2] != "post_processing"] == ["features", "dp_generator"]
    second, _, _ = submit(c, shared_data_dir, "run", "actg", "--config", str(cfg))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert ledger_rows(run_dir) == charged and _markers(run_dir) == markers  # every stage skipped


@full_only
def test_dpfair_submission_writes_to_storage_and_resumes(cluster, storage, shared_data_dir):
    c, _ = cluster
    cfg = _config(storage, "dpfair_tiny_test.yaml", "dpfair_tiny", output_dir=str(storage / "dpfair" / "dpfair_tiny"))
    first, _, _ = submit(c, shared_data_dir, "run", "dpfair", "--config", str(cfg))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run_dir = Path(first.stdout.split("run directory: ", 1)[1].split()[0])
    assert run_dir.is_relative_to(storage) and (run_dir / "ledger.sqlite").is_file()
    charged = ledger_rows(run_dir)
    assert any(r[2] != "post_processing" for r in charged), charged
    second, _, _ = submit(c, shared_data_dir, "run", "dpfair", "--config", str(cfg))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert ledger_rows(run_dir) == charged


@full_only
def test_killing_the_second_node_during_dp_sgd_fails_clearly_and_resume_charges_once(tmp_path, tmp_path_factory,
                                                                                      shared_data_dir):
    """Kill the GPU node while the private stage trains (AIM charged, DP-SGD in flight): the job fails
    with one clear line; the ledger holds AIM once and DP-SGD at most once (and no adapter without
    its charge); a resubmission (DP-SGD now allowed on the head) completes with each charge once."""
    c = LocalCluster(temp_dir=tmp_path_factory.mktemp("rayk"))  # short: Ray's socket paths have a length limit
    try:
        c.start_head(num_cpus=1)
        second = c.add_node(num_cpus=1, num_gpus=1)
        run_dir = tmp_path / "storage" / "actg_kill"
        raw = yaml.safe_load((REPO / "configs" / "actg_tiny.yaml").read_text())
        cfg = _config(tmp_path, "actg_tiny.yaml", "actg_kill", run_dir=str(run_dir),
                      generator={**raw["generator"], "steps": 40}, resources={"stages": {"private": {"gpus": 1}}})
        out, job_id, _ = submit(c, shared_data_dir, "run", "actg", "--config", str(cfg), wait=False)
        assert out.returncode == 0
        deadline = time.monotonic() + 900
        while not (run_dir / "stages" / "features.done").is_file():  # AIM done: DP-SGD is training now
            assert time.monotonic() < deadline, "the private stage did not reach DP-SGD"
            time.sleep(0.5)
        t0 = time.perf_counter()
        c.kill_node(second)
        follow = dpsynth(c, "jobs", "logs", job_id, "--follow", "--address", c.address)
        print(f"[cluster] killed the GPU node; the job ended {time.perf_counter() - t0:.1f}s later")
        assert follow.returncode == 1
        assert f"{job_id}: FAILED: error: stage 'private' was lost: its node or worker died" in follow.stderr
        after_kill = ledger_rows(run_dir)
        stages = [r[1] for r in after_kill]
        assert stages.count("features") == 1 and stages.count("dp_generator") <= 1, after_kill
        if "dp_generator" not in stages:
            assert not (run_dir / "generator" / "adapter" / "adapter_config.json").exists()  # no output unaccounted
        cfg.write_text(cfg.read_text().replace("gpus: 1", "gpus: 0"))  # resources are not the run's identity
        resumed, _, _ = submit(c, shared_data_dir, "run", "actg", "--config", str(cfg))
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        final = ledger_rows(run_dir)
        assert final[0] == after_kill[0]  # AIM's charge is the same row, not a second one
        assert [r[1] for r in final if r[2] != "post_processing"] == ["features", "dp_generator"], final
    finally:
        c.stop()


@full_only
def test_dpfair_to_s3_runs_its_model_stage_on_the_second_node_and_resumes_from_the_bucket(
        tmp_path, tmp_path_factory, shared_data_dir):
    """Run storage on an S3 API (moto's server on loopback): the DPFairLLM model stage runs on the
    GPU node and pushes from there; outputs, markers and ledger land in the bucket; with the local
    mirror deleted, a resubmission resumes from the bucket alone and charges nothing twice."""
    import shutil

    import boto3
    from ray_cluster import cluster_env
    from s3_server import moto_s3_server

    with moto_s3_server() as endpoint:
        mirror = tmp_path / "mirror"
        s3_env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                  "DPSYNTH_STORAGE_ENDPOINT_URL": endpoint, "DPSYNTH_MIRROR_DIR": str(mirror)}
        client = boto3.client("s3", endpoint_url=s3_env["DPSYNTH_STORAGE_ENDPOINT_URL"], region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="dpsynth-runs")
        c = LocalCluster(temp_dir=tmp_path_factory.mktemp("rays3"), env={**cluster_env(), **s3_env})  # nodes' own env
        try:
            c.start_head(num_cpus=1)
            c.add_node(num_cpus=1, num_gpus=1)
            cfg = _config(tmp_path, "dpfair_tiny_test.yaml", "dpfair_s3", output_dir="s3://dpsynth-runs/dpfair/dpfair_tiny",
                          use_ray=True, resources={"cpus": 1, "gpus": 1},
                          schema_path=str(REPO / "configs" / "schemas" / "adult.yaml"))  # read by the Ray task too
            first, _, _ = submit(c, shared_data_dir, "run", "dpfair", "--config", str(cfg))
            assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]

            def bucket() -> dict[str, bytes]:
                listed = client.list_objects_v2(Bucket="dpsynth-runs",
                                                Prefix="dpfair/dpfair_tiny/").get("Contents", [])
                return {o["Key"].removeprefix("dpfair/dpfair_tiny/"):
                        client.get_object(Bucket="dpsynth-runs", Key=o["Key"])["Body"].read() for o in listed}

            stored = bucket()
            assert {"stages/train.done", "stages/generate.done", "ledger.sqlite",
                    "release/MANIFEST.json"} <= set(stored)
            run_dir = mirror / "s3" / "dpsynth-runs" / "dpfair" / "dpfair_tiny"
            charged = ledger_rows(run_dir)
            assert any(r[2] != "post_processing" for r in charged) and stored["ledger.sqlite"] == (
                run_dir / "ledger.sqlite").read_bytes()
            shutil.rmtree(mirror)  # the next job runs where this run was never seen
            second, _, _ = submit(c, shared_data_dir, "run", "dpfair", "--config", str(cfg))
            assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
            assert ledger_rows(run_dir) == charged and bucket()["ledger.sqlite"] == stored["ledger.sqlite"]
        finally:
            c.stop()
