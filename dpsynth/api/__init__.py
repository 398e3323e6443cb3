"""The Python API: one job class per method over the run loop that `dpsynth run` uses.

    from dpsynth import ACTG
    run = ACTG.from_yaml("configs/actg_tiny.yaml").with_privacy(epsilon=4.0).run()
    run.ledger.epsilon, run.release_dir
"""

from dpsynth.api.job import Job
from dpsynth.api.methods import ACTG, AIM, METHODS, WASP, AugPE, DPFairLLM, Train
from dpsynth.api.run import LedgerView, Run

__all__ = ["ACTG", "AIM", "METHODS", "WASP", "AugPE", "DPFairLLM", "Job", "LedgerView", "Run", "Train"]
