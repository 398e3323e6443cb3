"""Run storage on an object store: a real S3 API (moto's server on loopback, no network), pyarrow's
S3 filesystem, the local mirror and its sync rules; a WASP run to s3:// that crashes after a DP
vote and resumes elsewhere (the local mirror deleted) from the bucket alone."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from dpsynth_core.actg.pipeline import ActgConfig
from dpsynth_core.config import load_config
from dpsynth_core.errors import ConfigError
from dpsynth_core.pe.config import PEConfig
from dpsynth_core.privacy import PrivacyLedger
from dpsynth_core.runs.storage import MIRROR_ENV_VAR, mirror_root, object_store_uri
from s3_server import moto_s3_server

PE = {"method": "augpe", "data": {"classes": ["a", "b"]}}
CLASSES = ["neuroscience", "bioinformatics", "microbiology"]
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3_endpoint():
    with moto_s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path, request):
    """A fresh bucket; credentials and endpoint from the environment only; a per-test mirror root."""
    import boto3

    for key, value in {**ENV, "DPSYNTH_STORAGE_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(MIRROR_ENV_VAR, str(tmp_path / "mirror"))
    bucket = request.node.name.replace("_", "-")[:60].strip("-").lower()
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)

    def keys(prefix: str = "") -> dict[str, bytes]:
        listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        return {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}

    return bucket, keys


def test_object_store_uris_map_to_a_mirror_and_refuse_credentials(monkeypatch, tmp_path):
    monkeypatch.setenv(MIRROR_ENV_VAR, str(tmp_path))
    run_dir = ActgConfig(run_dir="s3://bucket/runs/actg%20x").run_dir
    assert run_dir == tmp_path / "s3" / "bucket" / "runs" / "actg x" and mirror_root() == tmp_path
    assert object_store_uri(run_dir) == "s3://bucket/runs/actg x"
    assert object_store_uri(run_dir / "name") == "s3://bucket/runs/actg x/name"  # output_dir/name (DPFairLLM)
    assert object_store_uri(PEConfig(**PE, run_dir="gs://b/pe").run_dir) == "gs://b/pe"
    assert object_store_uri(tmp_path / "elsewhere") is None and object_store_uri(Path("/tmp/x")) is None
    assert PEConfig(**PE, run_dir="file:///mnt/shared/pe").run_dir == Path("/mnt/shared/pe")
    for uri in ("s3://AKIAEXAMPLE:hunter2secret@bucket/runs/x", "s3://bucket/runs/x?secret_key=hunter2secret"):
        (tmp_path / "c.yaml").write_text(yaml.safe_dump({"run_dir": uri}))
        with pytest.raises(ConfigError, match="credentials come from the environment") as err:
            load_config(tmp_path / "c.yaml", ActgConfig)
        assert "hunter2secret" not in str(err.value) and "AKIAEXAMPLE" not in str(err.value)
    with pytest.raises(ValueError, match="needs a bucket and a prefix"):
        PEConfig(**PE, run_dir="s3://bucket")
    with pytest.raises(ValueError, match=r"gcs:// run storage is not supported"):
        PEConfig(**PE, run_dir="gcs://bucket/x")


def test_gs_uses_pyarrows_gcs_filesystem(monkeypatch):
    """What can be checked offline for gs:// (no GCS emulator here): the filesystem and path chosen."""
    from pyarrow import fs

    from dpsynth_core.runs.storage_sync import filesystem_for

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")
    gcs, base = filesystem_for("gs://bucket/runs/x")
    assert isinstance(gcs, fs.GcsFileSystem) and base == "bucket/runs/x"


def _stage_dir(root: Path) -> None:
    (root / "stages").mkdir(parents=True)
    (root / "features.csv").write_text("a,b\n1,2\n")
    (root / "generator").mkdir()
    (root / "generator" / "adapter.safetensors").write_bytes(os.urandom(2048))
    (root / "synthetic.jsonl").write_text('{"text": "t"}\n')  # sorts after stages/: name order is not enough
    (root / "stages" / "features.done").write_text('{"stage": "features"}')


def test_push_uploads_commit_files_last_so_a_crash_never_shows_a_stage_without_its_files(s3):
    """The upload of an output fails half-way through a push (the driver died): the bucket has no
    marker for the stage; the next push completes it, marker included."""
    from dpsynth_core.runs.storage_sync import RunMirror, filesystem_for

    bucket, keys = s3
    uri = f"s3://{bucket}/runs/a"
    real, base = filesystem_for(uri)

    class DiesOnOutputUpload:
        """pyarrow's S3 filesystem, except that uploading synthetic.jsonl fails (a crash mid-push)."""

        def __init__(self, inner):
            self.inner = inner

        def open_output_stream(self, path, *args, **kwargs):
            if path.endswith("synthetic.jsonl"):
                raise ConnectionError("driver lost mid-upload")
            return self.inner.open_output_stream(path, *args, **kwargs)

        def __getattr__(self, name):  # every other call: the real S3 filesystem
            return getattr(self.inner, name)

    local = Path(os.environ[MIRROR_ENV_VAR]) / "s3" / bucket / "runs" / "a"
    _stage_dir(local)
    crashing = RunMirror(uri, local, filesystem=(DiesOnOutputUpload(real), base))
    with pytest.raises(ConnectionError):
        crashing.push()
    assert "runs/a/features.csv" in keys("runs/a")  # some outputs made it ...
    assert not any(k.endswith(".done") for k in keys("runs/a"))  # ... but no marker claims the stage

    RunMirror(uri, local).push()
    stored = keys("runs/a")
    assert stored["runs/a/stages/features.done"] == b'{"stage": "features"}'
    assert stored["runs/a/synthetic.jsonl"] == b'{"text": "t"}\n'
    assert stored["runs/a/generator/adapter.safetensors"] == (local / "generator" / "adapter.safetensors").read_bytes()


def test_a_stale_mirror_never_overwrites_newer_ledger_charges(s3):
    """Two mirrors of one run (two writers): the one that did not see the other's ledger record is
    refused, so the bucket's ledger keeps every charge; a deleted secret checkpoint leaves the bucket."""
    from dpsynth_core.privacy import GaussianEvent
    from dpsynth_core.runs.storage_sync import RunMirror, StorageConflictError

    bucket, keys = s3
    uri = f"s3://{bucket}/runs/ledger"
    a, b = Path(os.environ[MIRROR_ENV_VAR]) / "a", Path(os.environ[MIRROR_ENV_VAR]) / "b"
    ledger = PrivacyLedger.create(a, "d", epsilon_budget=8.0, delta=1e-5)
    (a / "checkpoints").mkdir()
    (a / "checkpoints" / "state.pt").write_bytes(b"secret sampling seed")
    RunMirror(uri, a).push()
    RunMirror(uri, b).pull()
    assert PrivacyLedger.open(b).entries() == []
    ledger.record("one", GaussianEvent(noise_multiplier=2.0))
    (a / "checkpoints" / "state.pt").unlink()  # training finished: the checkpoint (secret seed) is deleted
    RunMirror(uri, a).push()
    assert "runs/ledger/checkpoints/state.pt" not in keys("runs/ledger")
    PrivacyLedger.open(b).record("two", GaussianEvent(noise_multiplier=2.0))
    with pytest.raises(StorageConflictError, match="another writer"):
        RunMirror(uri, b).push()
    c = Path(os.environ[MIRROR_ENV_VAR]) / "c"
    RunMirror(uri, c).pull()
    assert [e.stage for e in PrivacyLedger.open(c).entries()] == ["one"]
    assert not (c / "checkpoints" / "state.pt").exists()


def test_owner_only_state_and_seed_bearing_checkpoints_never_reach_the_bucket(s3):
    """DPFairLLM's drawn row indices (owner_only/) and DP-SGD checkpoints (the secret sampling seed:
    a stage's checkpoint/, Ray Train's ray_train/) stay in the local mirror; outputs are uploaded."""
    from dpsynth_core.runs.storage_sync import RunMirror

    bucket, keys = s3
    uri = f"s3://{bucket}/runs/secrets"
    local = Path(os.environ[MIRROR_ENV_VAR]) / "s3" / bucket / "runs" / "secrets"
    secrets = ["owner_only/private_subset.json", "generator/checkpoint/train_state.json", "checkpoint/optimizer.pt",
               "generator/ray_train/run/checkpoint_step_0000002/train_state.json"]
    for rel in secrets + ["synthetic.jsonl", "generator/adapter/adapter_model.safetensors"]:
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_text("secret seed 123" if rel in secrets else "output")
    RunMirror(uri, local).push()
    stored = keys("runs/secrets")
    assert {"runs/secrets/synthetic.jsonl", "runs/secrets/generator/adapter/adapter_model.safetensors"} <= set(stored)
    assert not any("owner_only" in k or "checkpoint" in k or "ray_train" in k for k in stored)
    assert not any(b"secret seed" in v for v in stored.values())
    elsewhere = Path(os.environ[MIRROR_ENV_VAR]) / "elsewhere"
    RunMirror(uri, elsewhere).pull()
    assert (elsewhere / "synthetic.jsonl").is_file() and not (elsewhere / "owner_only").exists()


def _wasp_config(tmp_path: Path, run_dir: str) -> Path:
    cfg = {
        "method": "wasp", "run_dir": run_dir,
        "data": {"source": "biorxiv", "classes": CLASSES, "num_private": 12, "num_test": 0},
        "plms": [{"model": "tiny-llama", "name": "tiny-a", "backend": "hf", "seed": 1, "batch_size": 8}],
        "epsilon": 4.0, "iterations": 1, "num_synthetic": 6, "q": 1, "select_per_class": 1,
        "allow_degenerate_votes": True,  # a storage test: the votes' quality is not what it checks
        "max_new_tokens": 4, "seed": 0, "evaluate": False,
    }
    path = tmp_path / "wasp_s3.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def test_wasp_run_to_s3_crashes_after_a_vote_and_resumes_from_the_bucket_alone(s3, biorxiv_csv, tmp_path):
    """The run dies right after iteration 1's noisy vote. The bucket already holds the ledger's
    charge and the drawn vote (not yet the iteration's checkpoint, nor any release). With the local
    mirror deleted (another machine), the resubmission pulls the run, re-uses the stored vote, charges
    nothing twice, and its outputs land in the bucket."""
    from dpsynth_core.pe.llm import LLM
    from ray_jobs.pe_backends import make_llms
    from ray_jobs.pe_driver import run_pe

    bucket, keys = s3
    at_crash: dict[str, bytes] = {}

    class DiesAfterTheVote(LLM):
        """A real tiny-llama whose process dies at iteration 1's generation, right after the vote:
        what the bucket holds at that instant is all a resume elsewhere would find."""

        def __init__(self, inner):
            self.inner, self.name, self.calls = inner, inner.name, 0

        def generate(self, prompts, params):
            self.calls += 1
            if self.calls == 2:
                at_crash.update(keys("runs/wasp"))
                raise ConnectionError("PLM endpoint went away")
            return self.inner.generate(prompts, params)

    path = _wasp_config(tmp_path, f"s3://{bucket}/runs/wasp")
    with pytest.raises(ConnectionError):
        run_pe(path, "wasp", llm_factory=lambda plms: [DiesAfterTheVote(m) for m in make_llms(plms)])
    assert "runs/wasp/votes/iter_0001.json" in at_crash  # the drawn vote was durable before it was used
    stored = keys("runs/wasp")
    assert at_crash["runs/wasp/ledger.sqlite"] == stored["runs/wasp/ledger.sqlite"]  # its charge too
    assert stored["runs/wasp/checkpoints/latest"].strip() == b"iter_0000.json"  # iteration 1 not committed
    assert "runs/wasp/votes/iter_0001.json" in stored and "runs/wasp/synthetic.jsonl" not in stored
    assert not any(k.startswith("runs/wasp/release/") for k in stored)
    mirror = mirror_root() / "s3" / bucket / "runs" / "wasp"
    ledger = PrivacyLedger.open(mirror)
    votes = [(e.id, e.params) for e in ledger.entries() if e.stage == "wasp.topq_vote"]
    assert len(votes) == 1 and ledger.total_epsilon() > 0
    total = ledger.total_epsilon()
    vote = stored["runs/wasp/votes/iter_0001.json"]

    shutil.rmtree(mirror)  # resume on a machine that never saw this run
    assert run_pe(path, "wasp") == mirror
    stored = keys("runs/wasp")
    assert stored["runs/wasp/votes/iter_0001.json"] == vote  # the released vote, not a second draw
    ledger = PrivacyLedger.open(mirror)
    assert [(e.id, e.params) for e in ledger.entries() if e.stage == "wasp.topq_vote"] == votes  # not twice
    assert ledger.total_epsilon() == total
    assert stored["runs/wasp/ledger.sqlite"] == (mirror / "ledger.sqlite").read_bytes()
    assert stored["runs/wasp/checkpoints/latest"].strip() == b"iter_0001.json"
    rows = [json.loads(line) for line in stored["runs/wasp/synthetic.jsonl"].decode().splitlines()]
    assert len(rows) == 6
    manifest = json.loads(stored["runs/wasp/release/MANIFEST.json"])
    assert set(manifest["files"]) <= {k.removeprefix("runs/wasp/release/") for k in stored}
    ran_on = json.loads(stored["runs/wasp/ran_on.json"])["attempts"]
    assert len(ran_on) == 1 and [p["plm"] for p in ran_on[0]["plms"]] == ["tiny-a"]
