"""WASP: Top-Q, examples per class S, PLM temperatures (two PLMs)."""

from ray import tune


def default() -> dict:
    return {
        # Q <= 5 keeps the demo's first vote (10 candidates per class) non-degenerate (the runner refuses < 2Q)
        "q": tune.choice([1, 2, 4]),
        "select_per_class": tune.choice([2, 3, 5]),
        "plms.0.temperature": tune.uniform(0.7, 1.3),
        "plms.1.temperature": tune.uniform(0.7, 1.3),
    }


SPACES = {"default": default}
