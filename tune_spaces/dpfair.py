"""DPFairLLM: fairness weights (demographic parity, equalized odds; one weight shared by the
attributes of ``fairness.sensitive``), DP-SGD learning rate and steps, decoding temperature and tilt.

Only a sweep on public/proxy data (``privacy.data: public``): every DPFairLLM metric (TSTR, fairness
gaps, fidelity) is computed on real rows, so a private sweep is refused (``dpsynth_core.tuning.metrics``).
"""

from ray import tune


def default() -> dict:
    return {
        "fairness.lambda_dp": tune.uniform(0.0, 1.0),  # fraction of the group gap the DP term removes
        "fairness.lambda_eo": tune.uniform(0.0, 4.0),  # weight of the equalized-odds regularizer (tabular.fair_eo)
        "training.learning_rate": tune.loguniform(3e-3, 3e-2),
        "training.steps": tune.choice([10, 20, 30]),
        "generation.temperature": tune.uniform(0.7, 1.2),
        "generation.fairness.tilt": tune.choice([False, True]),
    }


def tiny() -> dict:
    """The fairness weights only, 2 DP-SGD steps: a quick check that a sweep runs (tiny-llama configs)."""
    return {
        "fairness.lambda_dp": tune.uniform(0.0, 1.0),
        "fairness.lambda_eo": tune.uniform(0.0, 4.0),
        "training.steps": tune.choice([2]),
    }


SPACES = {"default": default, "tiny": tiny}
