"""dpsynth_core: the library of differentially private synthetic data (text and tables).

The library is free of Ray: Ray lives in ``ray_jobs/``, ``serving/`` and ``tune_spaces/``, which
call into it, and the CLI in the top package ``dpsynth``. It imports none of them.
"""

__version__ = "0.1.0"

from dpsynth_core.quiet import vllm_log_level_from_env as _vllm_log_level

_vllm_log_level()  # every process that runs dpsynth code (Ray workers too) imports this first
