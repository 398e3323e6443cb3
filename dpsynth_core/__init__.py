"""dpsynth: differentially private synthetic data (text and tables).

The library is free of Ray: Ray lives in ``ray_jobs/``, ``serving/`` and ``tune_spaces/``,
which call into it.
"""

__version__ = "0.1.0"
