"""Object-store run storage: a local mirror of an ``s3://`` / ``gs://`` run directory (Ray-free).

The ledger is SQLite and needs a POSIX file, so a run whose directory is ``s3://bucket/prefix`` works
in a local mirror (``dpsynth_core.runs.storage.mirror_root()/s3/bucket/prefix``) that is kept in step
with the bucket through pyarrow's filesystems (the ones Ray Train's ``storage_path`` uses):

* **pull** (a resumed job, a stage on another node): every remote file whose content differs from
  the mirror's is downloaded; files the bucket no longer has are removed from the mirror.
* **push** (after a stage, at the end of a run): changed files are uploaded in commit order --
  the ledger first, then outputs, then deletions, then the *commit files* (``stages/*.done``,
  ``checkpoints/latest``, ``release/MANIFEST.json``) last. A crash part-way through a push leaves
  a stage's outputs without its marker (the stage is redone or closed from its outputs), never a
  marker whose files are missing.
* **durable writes**: :func:`make_durable` uploads one file at once. The ledger calls it after
  every record and PE after storing a noisy vote, so a DP event (and a drawn release) is in the
  bucket before the mechanism's output is used; a resume elsewhere never charges or draws twice.
  Files deleted locally are deleted in the bucket.
* **local only**: owner-only state and DP-SGD checkpoints (secret seeds) are never uploaded
  (``LOCAL_ONLY``); a resume elsewhere starts such a stage over.

Single writer: one stage at a time writes the run (the driver pulls after each remote stage). A
push never overwrites a remote file that changed since this mirror last saw it -- that would lose
another writer's ledger charges -- it raises :class:`StorageConflictError` instead.

Each side keeps the sha256 of every file as last synced: the mirror in ``.dpsynth-sync.json``,
the bucket in ``.dpsynth-sync/index.json`` (content hashes only). Credentials come from the
environment / the standard chain of the cloud SDK (pyarrow's), never from a config; the endpoint
of an S3-compatible store from ``DPSYNTH_STORAGE_ENDPOINT_URL`` or ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from dpsynth_core.errors import ConfigError, DpsynthError
from dpsynth_core.runs.storage import object_store_uri

LOCAL_STATE = ".dpsynth-sync.json"
REMOTE_INDEX = ".dpsynth-sync/index.json"
LEDGER_NAME = "ledger.sqlite"
COMMIT_FILES = ("stages/*.done", "checkpoints/latest", "release/MANIFEST.json")  # uploaded last
# Secrets never leave the machine: owner-only state (DPFairLLM's drawn row indices) and DP-SGD
# checkpoints (they hold the secret sampling seed; ``checkpoint/`` of a stage, Ray Train's
# ``ray_train/``). A run resumed on another machine starts such a stage over (or, for DPFairLLM's
# subset after a DP stage, refuses), which costs time, never privacy.
LOCAL_ONLY = ("owner_only/*", "checkpoint/*", "*/checkpoint/*", "ray_train/*", "*/ray_train/*")
_SKIPPED = (LOCAL_STATE, ".dpsynth-sync/*", "*.tmp", "*/.*.tmp", ".ledger-*", "*-journal", "*-wal", "*-shm",
            ".lock", *LOCAL_ONLY)  # .lock: runs/lock.py's flock file belongs to one machine
ENDPOINT_ENV = ("DPSYNTH_STORAGE_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


class StorageConflictError(DpsynthError):
    """The bucket holds a newer version of a file this mirror also changed (two writers)."""


def _endpoint() -> str | None:
    return next((os.environ[k] for k in ENDPOINT_ENV if os.environ.get(k)), None)


def filesystem_for(uri: str):
    """``(pyarrow filesystem, base path)`` for ``s3://bucket/prefix`` or ``gs://bucket/prefix``."""
    parsed = urlparse(uri)
    settings = (_endpoint(), os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
                os.environ.get("STORAGE_EMULATOR_HOST"))
    return _filesystem(parsed.scheme, *settings), f"{parsed.netloc}/{parsed.path.strip('/')}"


@functools.lru_cache(maxsize=8)
def _filesystem(scheme: str, endpoint: str | None, region: str | None, emulator: str | None):
    """One client per store and setting (creating one costs about a second)."""
    from pyarrow import fs

    if scheme == "s3":
        kwargs: dict = {"region": region or "us-east-1"}
        if endpoint:
            ep = urlparse(endpoint)
            kwargs.update(endpoint_override=ep.netloc or ep.path, scheme=ep.scheme or "https")
        return fs.S3FileSystem(**kwargs)
    if scheme == "gs":
        if emulator:  # STORAGE_EMULATOR_HOST: the GCS SDKs' convention for a local emulator
            ep = urlparse(emulator if "://" in emulator else f"http://{emulator}")
            return fs.GcsFileSystem(anonymous=True, scheme=ep.scheme, endpoint_override=ep.netloc)
        return fs.GcsFileSystem()
    raise ConfigError(f"{scheme}:// run storage is not supported (s3:// or gs://)")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _matches(rel: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(Path(rel).name, p) for p in patterns)


def _commit_rank(rel: str) -> int:
    """Upload order: ledger (0), outputs (1), commit files (2)."""
    return 0 if rel == LEDGER_NAME else 2 if _matches(rel, COMMIT_FILES) else 1


class RunMirror:
    """The local mirror ``local`` of the run directory ``uri`` (see the module docstring)."""

    def __init__(self, uri: str, local: str | Path, filesystem=None) -> None:
        self.uri, self.local = uri, Path(local)
        self.fs, self.base = filesystem if filesystem is not None else filesystem_for(uri)

    # ----------------------------------------------------------------------- bookkeeping
    def _load_state(self) -> dict[str, str]:
        path = self.local / LOCAL_STATE
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    def _save_state(self, state: dict[str, str]) -> None:
        self.local.mkdir(parents=True, exist_ok=True)
        tmp = self.local / f"{LOCAL_STATE}.tmp"
        tmp.write_text(json.dumps(state, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.local / LOCAL_STATE)

    def _remote(self, rel: str) -> str:
        return f"{self.base}/{rel}"

    def remote_index(self) -> dict[str, str]:
        from pyarrow import fs

        if self.fs.get_file_info(self._remote(REMOTE_INDEX)).type != fs.FileType.File:
            return {}
        with self.fs.open_input_stream(self._remote(REMOTE_INDEX)) as f:
            return json.loads(f.read().decode("utf-8"))

    def _write_index(self, index: dict[str, str]) -> None:
        with self.fs.open_output_stream(self._remote(REMOTE_INDEX)) as f:
            f.write(json.dumps(index, sort_keys=True).encode("utf-8"))

    def remote_files(self) -> list[str]:
        """Relative names of the files in the bucket under this run's prefix."""
        from pyarrow import fs

        infos = self.fs.get_file_info(fs.FileSelector(self.base, recursive=True, allow_not_found=True))
        rels = [i.path[len(self.base) + 1:] for i in infos if i.type == fs.FileType.File]
        return sorted(r for r in rels if not _matches(r, _SKIPPED))

    def local_files(self) -> dict[str, str]:
        """``{relative name: sha256}`` of the mirror's files (temporary and sync files left out)."""
        if not self.local.is_dir():
            return {}
        out = {}
        for path in self.local.rglob("*"):
            rel = path.relative_to(self.local).as_posix()
            if path.is_file() and not path.is_symlink() and not _matches(rel, _SKIPPED):
                out[rel] = _sha256(path)
        return out

    # ----------------------------------------------------------------------- transfers
    def _download(self, rel: str) -> Path:
        target = self.local / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as out, self.fs.open_input_stream(self._remote(rel)) as src:
            for block in iter(lambda: src.read(1 << 20), b""):
                out.write(block)
        return Path(tmp)

    def _upload(self, rel: str) -> None:
        with open(self.local / rel, "rb") as src, self.fs.open_output_stream(self._remote(rel)) as out:
            for block in iter(lambda: src.read(1 << 20), b""):
                out.write(block)

    def pull(self) -> list[str]:
        """Bring the mirror up to the bucket; returns the files downloaded."""
        state, index, remote = self._load_state(), self.remote_index(), self.remote_files()
        fetched = []
        for rel in remote:
            path = self.local / rel
            local_sha = _sha256(path) if path.is_file() else None
            if rel != LEDGER_NAME and index.get(rel) is not None and index[rel] == local_sha:
                state[rel] = local_sha  # same content (the ledger is always compared byte for byte)
                continue
            tmp = self._download(rel)
            remote_sha = _sha256(tmp)
            if remote_sha == local_sha:
                tmp.unlink()
            elif local_sha is not None and local_sha != state.get(rel):
                tmp.unlink()
                raise StorageConflictError(
                    f"{self.uri}/{rel} changed in the bucket and in the local mirror {self.local}: two writers? "
                    "Nothing was overwritten; keep one writer per run")
            else:
                os.replace(tmp, path)
                fetched.append(rel)
            state[rel] = remote_sha
        for rel in [r for r in state if r not in remote]:  # gone from the bucket (e.g. a deleted checkpoint)
            path = self.local / rel
            if path.is_file() and _sha256(path) == state[rel]:
                path.unlink()
            state.pop(rel)
        self._save_state(state)
        return fetched

    def push(self, only: Iterable[str] | None = None) -> list[str]:
        """Upload what changed in the mirror (ledger, outputs, deletions, commit files last)."""
        state, index = self._load_state(), self.remote_index()
        local = self.local_files()
        names = set(only) if only is not None else set(local) | set(state)
        changed = sorted((r for r in names if r in local and state.get(r) != local[r]), key=lambda r: (_commit_rank(r), r))
        deleted = sorted(r for r in names if r not in local and r in state)
        for rel in changed + deleted:
            if rel in index and index[rel] != state.get(rel):
                raise StorageConflictError(
                    f"{self.uri}/{rel} changed in the bucket since this mirror last synced it: another writer "
                    f"wrote the run; nothing was overwritten (pull first, and keep one writer per run)")
        committed = [r for r in changed if _commit_rank(r) == 2]
        for rel in [r for r in changed if _commit_rank(r) < 2]:
            self._upload(rel)
            state[rel] = index[rel] = local[rel]
        for rel in deleted:
            self.fs.delete_file(self._remote(rel))
            state.pop(rel, None)
            index.pop(rel, None)
        if committed:  # outputs durable before any marker that says they are complete
            self._write_index(index)
            self._save_state(state)
        for rel in committed:
            self._upload(rel)
            state[rel] = index[rel] = local[rel]
        if changed or deleted:
            self._write_index(index)
        self._save_state(state)
        return changed + deleted


# --------------------------------------------------------------------------- process-wide hooks
_ACTIVE: dict[Path, RunMirror] = {}


def mirror_for(run_dir: str | Path) -> RunMirror | None:
    """The mirror of ``run_dir`` when it is an object-store run, else None."""
    root = Path(run_dir).resolve()
    if root in _ACTIVE:
        return _ACTIVE[root]
    uri = object_store_uri(root)
    return RunMirror(uri, root) if uri else None


def make_durable(run_dir: str | Path, *paths: str | Path) -> None:
    """Upload ``paths`` (files of ``run_dir``) to the run's object store now; a no-op for local runs.

    Called after every ledger record and after a noisy release is stored, before it is used."""
    mirror = mirror_for(run_dir)
    if mirror is None:
        return
    rels = [Path(p).resolve().relative_to(mirror.local.resolve()).as_posix() for p in paths]
    mirror.push(only=rels)


@contextmanager
def synced_run(run_dir: str | Path, *, resume: bool = True, uri: str | None = None) -> Iterator[RunMirror | None]:
    """A driver's (or a stage's) span over an object-store run: pull first, push at the end (also
    after a failure: what completed is kept; commit files are only written for complete stages).
    Yields None for a local run. ``uri`` is given where this node's mirror root may differ."""
    uri = uri or object_store_uri(run_dir)
    if uri is None:
        yield None
        return
    mirror = RunMirror(uri, Path(run_dir).resolve())
    if not resume and mirror.remote_files():
        raise ConfigError(f"{uri} already holds a run; --fresh cannot move an object-store run aside: "
                          "give run_dir a new prefix (or delete the old one yourself)")
    previous = _ACTIVE.get(mirror.local)
    _ACTIVE[mirror.local] = mirror
    try:
        mirror.pull()
        try:
            yield mirror
        finally:
            mirror.push()
    finally:
        if previous is None:
            _ACTIVE.pop(mirror.local, None)
        else:
            _ACTIVE[mirror.local] = previous
