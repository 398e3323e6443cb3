"""A run on disk: its directory and rerun rule, lock, stage markers, release and storage (Ray-free).

The bottom of the library, beside ``config`` and ``errors``: nothing here imports a method, an
engine or the privacy ledger (a release is written from the ledger object its caller passes in).

* ``run_dir``: the rerun rule and the stage markers, re-exported here;
* ``lock``: one process per run directory;
* ``release``: ``RUN_DIR/release/`` and its manifest;
* ``storage`` / ``storage_sync``: where a run lives (a path or an object store) and its local mirror;
* ``files``: atomic writes.
"""

from dpsynth_core.runs.run_dir import (
    CONFIG_FILE,
    StageMarkers,
    announce_finished,
    changed_keys,
    move_aside,
    open_run_dir,
    refuse_changed_config,
    snapshot_text,
)

__all__ = [
    "CONFIG_FILE",
    "StageMarkers",
    "announce_finished",
    "changed_keys",
    "move_aside",
    "open_run_dir",
    "refuse_changed_config",
    "snapshot_text",
]
