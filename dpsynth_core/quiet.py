"""Quiet output: silence what a user cannot act on, in the CLI process and in Ray workers.

Called once by the CLI entry (:func:`quiet_process`); Ray drivers pass :func:`quiet_env` in their
runtime_env so workers on other nodes are quiet too (a local Ray's workers inherit the CLI's
environment). What goes:

* model-loading progress bars (transformers' "Loading weights" / "Loading checkpoint shards": they
  use huggingface_hub's switch, read from the environment at import);
* FutureWarning / DeprecationWarning raised inside libraries (``PYTHONWARNINGS`` reaches workers);
* vLLM's engine notices below ERROR (``VLLM_LOGGING_LEVEL``, read by its engine subprocess too), and
  torch's own Python log lines below ERROR (``TORCH_LOGS``);
* Ray's usage-stats notice, and its notice that token authentication is on (the secure default: the
  notice is dropped, the setting is not touched);
* trl / transformers Trainer's raw metric dicts (:func:`quiet_trainer`).

Every variable is a default: a user who sets it keeps their value. ``DPSYNTH_VERBOSE=1`` turns
all of this off (for debugging).
"""

from __future__ import annotations

import logging
import os
import warnings

VERBOSE_ENV = "DPSYNTH_VERBOSE"

_QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "DATASETS_VERBOSITY": "error",
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage-stats prompt (and no telemetry from private runs)
    # trl checks the installed vLLM's version on import (we do not run trl's vLLM path): in Ray workers too
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning,"
                      "ignore:TRL currently supports vLLM versions:UserWarning",
    # vLLM's engine (and its EngineCore subprocess) logs its settings and notices at WARNING: eager mode,
    # Triton absent on CPU, LoRA tokenizer deprecations; errors still show
    "VLLM_LOGGING_LEVEL": "ERROR",
    # torch's C++ warnings ("[W... utils.cpp] Warning: NUMA binding", from vLLM's CPU worker binding threads)
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    # torch's Python loggers below ERROR: on a CPU host without triton, vLLM's custom ops make torch log
    # "Triton not available, find_triton_kernels = []" in every engine process, before any of our code runs there
    "TORCH_LOGS": "-torch",
}

# Ray logs this on every local start; token auth stays on, only the notice goes.
_RAY_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"
_RAY_TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"
_RAY_INIT_LOGGER = "ray._private.worker"
_RAY_REINIT_NOTICE = "Calling ray.init() again after it has already been called"


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes")


def quiet_env() -> dict[str, str]:
    """Environment variables for Ray workers (runtime_env env_vars); empty when verbose."""
    if verbose():
        return {}
    return {k: os.environ.get(k, v) for k, v in _QUIET_ENV.items()}


class _DropText(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def vllm_log_level_from_env() -> None:
    """vLLM configures its loggers only when an engine starts, so what it logs while being imported (on a
    CPU host: "Triton is installed, but doesn't include CPU backend"; trl imports vLLM to check its version)
    reaches the root logger at WARNING, which a Ray worker prints. Give the ``vllm`` loggers the level
    ``VLLM_LOGGING_LEVEL`` asks for (quiet runs set ERROR; DPSYNTH_VERBOSE=1 leaves it unset)."""
    level = os.environ.get("VLLM_LOGGING_LEVEL")
    if level:
        logging.getLogger("vllm").setLevel(level.upper())


def plain_library_messages() -> None:
    """dpsynth's own one-line notices (e.g. "generation engine: vllm for model ...") as plain lines on
    stderr, whatever a library did to the root logger (some call ``logging.basicConfig`` and would
    prefix them with "WARNING:dpsynth_core...")."""
    logger = logging.getLogger("dpsynth_core")
    if not any(getattr(h, "_dpsynth_plain", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._dpsynth_plain = True
        logger.addHandler(handler)
        logger.propagate = False


def ray_worker_setup() -> None:
    """Ray's ``worker_process_setup_hook`` for every worker of a dpsynth job (``ray_jobs.cluster``)."""
    plain_library_messages()
    vllm_log_level_from_env()
    if os.environ.get("VLLM_LOGGING_LEVEL") == "ERROR":  # set by quiet_env: a quiet run
        quiet_ray_llm_loggers()


def quiet_ray_llm_loggers() -> None:
    """Ray's LLM layer gives each of its loggers an INFO console handler ("No cloud storage mirror
    configured", "Downloading model and tokenizer", one line per batch) unless "ray.llm" already has a
    handler: give it one that prints nothing; WARNING and up still reach the process's root handler."""
    llm_logger = logging.getLogger("ray.llm")
    llm_logger.setLevel(logging.WARNING)
    if not llm_logger.handlers:
        llm_logger.addHandler(logging.NullHandler())


def quiet_process() -> None:
    """Quiet this process and the processes it starts (call before importing transformers or Ray)."""
    plain_library_messages()
    if verbose():
        return
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    # mbi (AIM's estimator) words its own deprecation as a UserWarning about the data frames we pass
    warnings.filterwarnings("ignore", message="Pandas dataframe inputs are deprecated", category=UserWarning)
    # trl checks the installed vLLM's version on import; we do not run trl's vLLM generation path
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions", category=UserWarning)
    # vLLM logs this on import, before its own logging is configured (so VLLM_LOGGING_LEVEL misses it)
    logging.getLogger("vllm.triton_utils.importing").setLevel(logging.ERROR)
    _drop_notice(_RAY_TOKEN_LOGGER, _RAY_TOKEN_NOTICE)
    # Ray's LLM batch processor calls ray.init() again (ignore_reinit_error): Ray says so at INFO
    _drop_notice(_RAY_INIT_LOGGER, _RAY_REINIT_NOTICE)
    quiet_ray_llm_loggers()


def _drop_notice(logger_name: str, text: str) -> None:
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _DropText) and f.text == text for f in logger.filters):
        logger.addFilter(_DropText(text))


def quiet_trainer(trainer) -> None:
    """Drop a transformers/trl Trainer's printing of raw log dicts (its history is kept in ``state``)."""
    if verbose():
        return
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    class _BarOnly(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # the bar, not the dict
            return None

    trainer.remove_callback(PrinterCallback)
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(_BarOnly())
