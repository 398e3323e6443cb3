"""Aug-PE: vote threshold and PLM temperature."""

from ray import tune


def default() -> dict:
    return {"threshold": tune.choice([0.0, 1.0, 2.0]), "plms.0.temperature": tune.uniform(0.7, 1.3)}


SPACES = {"default": default}
