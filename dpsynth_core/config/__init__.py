"""Configs and where things run: the bottom of the library, beside ``runs`` and ``errors``.

* ``strict``: ``StrictConfig`` (unknown keys are errors), ``load_config`` and the size caps,
  re-exported here (``from dpsynth_core.config import StrictConfig, load_config``);
* ``keys``: renamed keys, accepted for one release with a line naming the new key;
* ``budget``: ``BudgetConfig``, the base of every run config with a ``privacy:`` section;
* ``paths``: input paths resolved next to the config file;
* ``resources``: what a stage asks its scheduler for (CPUs, GPUs, memory);
* ``placement``: which device and dtype a stage's model runs on.
"""

from dpsynth_core.config.strict import (
    BATCH_CAP,
    DELTA_CHECK,
    NEW_TOKENS_CAP,
    OUTPUT_ROWS_CAP,
    RECORDS_CAP,
    SEQ_LEN_CAP,
    STEPS_CAP,
    TEXT_CHARS_CAP,
    THREADS_CAP,
    StrictConfig,
    cap,
    caps_of,
    format_validation_error,
    load_config,
)

__all__ = [
    "BATCH_CAP",
    "DELTA_CHECK",
    "NEW_TOKENS_CAP",
    "OUTPUT_ROWS_CAP",
    "RECORDS_CAP",
    "SEQ_LEN_CAP",
    "STEPS_CAP",
    "TEXT_CHARS_CAP",
    "THREADS_CAP",
    "StrictConfig",
    "cap",
    "caps_of",
    "format_validation_error",
    "load_config",
]
