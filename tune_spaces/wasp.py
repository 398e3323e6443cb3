"""WASP: Top-Q, examples per class S, PLM temperatures (two PLMs)."""

from ray import tune


def default() -> dict:
    return {
        "q": tune.choice([2, 4, 8]),
        "select_per_class": tune.choice([2, 3, 5]),
        "plms.0.temperature": tune.uniform(0.7, 1.3),
        "plms.1.temperature": tune.uniform(0.7, 1.3),
    }


SPACES = {"default": default}
