"""Where a run lives: a local path, a shared-filesystem path, or a ``file://`` URI (Ray-free).

On a cluster the run directory (outputs, checkpoints, the SQLite ledger) must be reachable by
every node and by the next job: a shared filesystem mounted at the same path everywhere (NFS,
a cloud file share, or a bucket mounted with gcsfuse / s3fs / mountpoint-s3). Inside a submitted
Ray job a *relative* run directory would land in the job's temporary working directory and vanish
with it, so :func:`require_durable_run_dir` refuses it.

``s3://`` and ``gs://`` are refused with a clear message: SQLite (the ledger) cannot live on an
object store, and a staging mirror synced at stage boundaries (ledger journal uploaded before a
stage's outputs) is not built yet; mount the bucket instead.

    run_dir: RunDirPath = Path("runs/x")   # in a config: accepts "/mnt/shared/runs/x", "file:///mnt/shared/runs/x"
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated
from urllib.parse import unquote, urlparse

from pydantic import BeforeValidator

from dpsynth_core.errors import ConfigError

JOB_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor in a submitted job's driver
OBJECT_STORE_SCHEMES = ("s3", "gs", "gcs", "abfs", "az", "hdfs")


def parse_run_location(value: object) -> Path:
    """A local :class:`Path` for ``value`` (a path or a ``file://`` URI); object stores are refused."""
    if isinstance(value, Path):
        return value
    if not isinstance(value, str):
        raise ValueError("expected a path or a file:// URI")
    text = value.strip()
    scheme = urlparse(text).scheme.lower() if "://" in text else ""
    if scheme == "file":
        parsed = urlparse(text)
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{text}: a file:// URI names a path on every node, not a host (use file:///path)")
        return Path(unquote(parsed.path))
    if scheme in OBJECT_STORE_SCHEMES:
        raise ValueError(
            f"{text}: {scheme}:// run storage is not supported yet (the SQLite ledger cannot live on an object "
            "store); mount the bucket on every node (gcsfuse, s3fs, mountpoint-s3) and give the mount path")
    if scheme:
        raise ValueError(f"{text}: unknown storage scheme '{scheme}://' (use a path or file:///path)")
    return Path(text)


RunDirPath = Annotated[Path, BeforeValidator(parse_run_location)]


def in_submitted_job() -> bool:
    """True in the driver of a job submitted with ``dpsynth submit`` / Ray's job API."""
    return JOB_ENV_VAR in os.environ


def require_durable_run_dir(path: Path, field: str = "run_dir") -> Path:
    """``path`` made absolute; inside a submitted job a relative one is a ConfigError."""
    path = Path(path)
    if in_submitted_job() and not path.is_absolute():
        raise ConfigError(
            f"{field} '{path}' is relative: inside a submitted Ray job it would be written to the job's temporary "
            f"working directory and lost when the job ends; set {field} to shared storage (absolute path or URI, "
            "e.g. file:///mnt/shared/runs/NAME) that every node and the next job can reach")
    return path.resolve()
