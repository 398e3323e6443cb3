"""Where a run lives: a local path, a shared-filesystem path, a ``file://`` URI, or an object store (Ray-free).

On a cluster the run directory (outputs, checkpoints, the SQLite ledger) must be reachable by
every node and by the next job: a shared filesystem mounted at the same path everywhere (NFS,
a cloud file share, a mounted bucket), or an ``s3://`` / ``gs://`` URI. Inside a submitted Ray job
a *relative* run directory would land in the job's temporary working directory and vanish with it,
so :func:`require_durable_run_dir` refuses it.

SQLite (the ledger) cannot live on an object store, so an ``s3://bucket/prefix`` run directory is
parsed to a local *mirror* directory, ``mirror_root()/s3/bucket/prefix``, which
:mod:`dpsynth_core.runs.storage_sync` keeps in step with the bucket; :func:`object_store_uri` maps a
mirror path (or any path under it) back to its URI. Credentials never appear in a URI or a config:
they come from the environment / the cloud's standard credential chain.

    run_dir: RunDirPath = Path("runs/x")   # in a config: "/mnt/shared/runs/x", "file:///mnt/shared/runs/x", "s3://b/runs/x"
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated
from urllib.parse import unquote, urlparse

from pydantic import BeforeValidator

from dpsynth_core.errors import ConfigError

JOB_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor in a submitted job's driver
MIRROR_ENV_VAR = "DPSYNTH_MIRROR_DIR"  # where object-store runs are mirrored (same path on every node)
SUPPORTED_OBJECT_STORES = ("s3", "gs")
OBJECT_STORE_SCHEMES = (*SUPPORTED_OBJECT_STORES, "gcs", "abfs", "az", "hdfs")
_CREDENTIAL_WORDS = ("key", "secret", "token", "password", "credential", "signature")


def mirror_root() -> Path:
    """The local directory that mirrors object-store runs (``$DPSYNTH_MIRROR_DIR``, else a user cache)."""
    root = os.environ.get(MIRROR_ENV_VAR) or Path.home() / ".cache" / "dpsynth" / "run-mirrors"
    return Path(root).expanduser().resolve()


def _mirror_of(text: str, scheme: str) -> Path:
    """The mirror directory of ``scheme://bucket/prefix``; a URI that carries credentials is refused."""
    parsed = urlparse(text)
    if scheme not in SUPPORTED_OBJECT_STORES:
        raise ValueError(f"{scheme}:// run storage is not supported (use s3://, gs://, a path or file:///path)")
    if "@" in parsed.netloc or parsed.query or parsed.fragment:
        words = [w for w in _CREDENTIAL_WORDS if w in (parsed.netloc + parsed.query).lower()] or ["user info/query"]
        raise ValueError(f"{scheme}:// run storage: the URI carries {words[0]}-like parts; give bucket and prefix "
                         "only -- credentials come from the environment (standard credential chain), never "
                         "from a config")
    bucket, prefix = parsed.netloc, unquote(parsed.path).strip("/")
    parts = [p for p in prefix.split("/") if p]
    if not bucket or not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"{scheme}:// run storage needs a bucket and a prefix: {scheme}://BUCKET/PREFIX")
    return mirror_root().joinpath(scheme, bucket, *parts)


def object_store_uri(path: str | Path) -> str | None:
    """``s3://bucket/prefix`` for a path inside an object-store mirror; None for any other path."""
    try:
        rel = Path(path).expanduser().resolve().relative_to(mirror_root())
    except ValueError:
        return None
    if len(rel.parts) < 3 or rel.parts[0] not in SUPPORTED_OBJECT_STORES:
        return None
    return f"{rel.parts[0]}://" + "/".join(rel.parts[1:])


def parse_run_location(value: object) -> Path:
    """A local :class:`Path` for ``value``: a path, a ``file://`` URI, or the mirror of an s3:// / gs:// URI."""
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
        return _mirror_of(text, scheme)
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
