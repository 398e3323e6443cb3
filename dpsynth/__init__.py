"""dpsynth: the product's top package, above the Ray drivers and Serve.

    dpsynth (the CLI, dpsynth/cli/, and the Python API, dpsynth/api/)  >  ray_jobs, serving  >  dpsynth_core

    from dpsynth import ACTG, WASP, AugPE, DPFairLLM, AIM, Train
    run = AIM.from_yaml("configs/aim_tiny_test.yaml").run()

The layers are contracts (``[tool.importlinter]`` in pyproject.toml), checked first by ``make test``.
Importing this package imports no method and no Ray: the API loads them when first used.
"""

from __future__ import annotations

_API = ("ACTG", "AIM", "WASP", "AugPE", "DPFairLLM", "Train", "Job", "Run", "LedgerView", "METHODS")


def __getattr__(name: str):
    if name in _API:  # lazily: `dpsynth --help` stays fast and imports neither torch nor Ray
        from dpsynth import api

        return getattr(api, name)
    raise AttributeError(f"module 'dpsynth' has no attribute {name!r}")


__all__ = list(_API)
