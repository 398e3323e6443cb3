"""ACTG-ARL: the eps1/eps2 split, the gamma schedule, LoRA rank, learning rate, steps vs noise."""

from ray import tune


def default() -> dict:
    return {
        # share of the total epsilon given to AIM (eps1); the generator gets the rest (eps2)
        "privacy.features_share": tune.uniform(0.2, 0.8),
        "rl.gamma0": tune.choice([1.0, 2.0, 4.0]),
        "rl.gamma1": tune.choice([0.0, 0.2, 0.5]),
        "rl.schedule": tune.choice(["linear", "cosine", "step"]),
        "generator.lora.r": tune.choice([4, 8, 16]),
        "generator.learning_rate": tune.loguniform(1e-4, 3e-3),
        # at a fixed eps2, more steps means more noise per step
        "generator.steps": tune.choice([20, 40, 80]),
    }


def split_and_schedule() -> dict:
    """The two questions of the paper: how to split eps, and how fast to let go of the anchor."""
    return {
        "privacy.features_share": tune.uniform(0.2, 0.8),
        "rl.gamma0": tune.choice([1.0, 2.0, 4.0]),
        "rl.schedule": tune.choice(["linear", "cosine", "step"]),
    }


def tiny() -> dict:
    """For tests: cheap knobs only."""
    return {"privacy.features_share": tune.uniform(0.3, 0.7), "rl.gamma0": tune.choice([1.0, 2.0])}


SPACES = {"default": default, "split_and_schedule": split_and_schedule, "tiny": tiny}
