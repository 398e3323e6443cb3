"""DPFairLLM's frozen recipe (``recipe: fair-v1``, the default): the settings a config leaves out.

``recipe: none`` opts out: the bare method, each building block off (the config fields' own defaults).

The recipe was chosen on Adult (docs/guides/dpfair.md; its figures in docs/results/) and is frozen: a
change is a new recipe name, so a run made with ``fair-v1`` stays reproducible. It names no column of any
data set. What depends on the data is derived from the schema and from the run's DP outputs:

- the sensitive attribute(s): the config's ``fairness.sensitive``, else the schema's first one, enforced in
  training and in generation alike;
- ``generation.calibrate.stratify: auto``: the enforced sensitive attribute(s), plus (with one) the
  categorical column most associated with it in the run's released DP (column, A) tables
  (``tabular.strata``: post-processing, no extra budget); those columns are written first.

Two settings depend on epsilon. They were chosen at epsilon = 1 and epsilon = 4; below
``LOW_EPSILON`` (2, the geometric mean of the two) a run takes the epsilon = 1 choice, else the other.
"""

from __future__ import annotations

import copy

RECIPE = "fair-v1"
BARE = "none"  # recipe: none, the opt-out
LOW_EPSILON = 2.0

# (epsilon < LOW_EPSILON, otherwise): more of a small budget to the tables the labels come from, coarser
# numeric bins against their larger noise, label rates nearer parity where the parity gap runs larger
_BY_EPSILON = {
    "marginals_share": (0.5, 0.2),
    "marginal_bins": (10, 20),
    "rate_mix": (0.4, 0.5),
}


def _pick(name: str, epsilon: float):
    low, high = _BY_EPSILON[name]
    return low if epsilon < LOW_EPSILON else high


def recipe_settings(epsilon: float) -> dict:
    """Every setting of ``fair-v1`` at ``epsilon``, as a config mapping (sensitive attributes not included)."""
    return {
        "budget": {"domain": 0.05, "fair_stats": 0.05, "marginals": _pick("marginals_share", epsilon)},
        "serialization": {"separator": ", ", "prefix": "none", "random_order": False},
        "training": {
            "model": "smollm2-135m-instruct",
            "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]},
            "steps": 10, "expected_batch_size": 16, "physical_batch_size": 16, "learning_rate": 0.01,
            "clipping": "hooks", "max_seq_len": 64,
            "public_stage": {"steps": 30, "rows": 512, "batch_size": 8, "learning_rate": 0.003,
                             "rows_from": "dp_marginals", "marginal_bins": _pick("marginal_bins", epsilon)},
        },
        "fairness": {"lambda_dp": 1.0, "lambda_eo": 1.0},
        "generation": {
            "batch_size": 50,
            "calibrate": {"enabled": True, "pool_factor": 2.0, "pairs_with_target": True,
                          "pairs_with_sensitive": True, "labels": "dp_tables", "label_cut": "raked",
                          "label_prior": 1.0, "stratify": "auto"},
            "fairness": {"enabled": True, "max_dp_gap": 0.1, "warmup_rows": 50, "tilt": True,
                         "rate_mix": _pick("rate_mix", epsilon)},
        },
    }


def _under(recipe: dict, given: dict) -> dict:
    """``given`` with every key it leaves out taken from ``recipe`` (sections merged key by key)."""
    out = copy.deepcopy(recipe)
    for key, value in given.items():
        out[key] = _under(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def apply_recipe(raw: dict) -> dict:
    """A raw DPFairLLM config mapping with ``recipe: fair-v1``: the recipe under what the config says.

    Generation enforces the training's sensitive attribute(s) unless the config names its own."""
    privacy = raw.get("privacy") if isinstance(raw.get("privacy"), dict) else {}
    epsilon = privacy.get("epsilon", raw.get("epsilon"))
    if epsilon is None:  # the config's own validation names the missing privacy.epsilon
        return raw
    if not isinstance(epsilon, (int, float)) or isinstance(epsilon, bool):
        raise ValueError(f"recipe '{RECIPE}' chooses settings by epsilon: give privacy.epsilon as a number")
    resolved = _under(recipe_settings(float(epsilon)), raw)
    generation = raw.get("generation") if isinstance(raw.get("generation"), dict) else {}
    for part in ("calibrate", "fairness"):  # a part the config turns off is taken as written
        if isinstance(generation.get(part), dict) and generation[part].get("enabled") is False:
            resolved["generation"][part] = copy.deepcopy(generation[part])
    sensitive = (raw.get("fairness") or {}).get("sensitive")
    gen_fair = resolved["generation"]["fairness"]
    if sensitive is not None and gen_fair.get("enabled") and gen_fair.get("sensitive") is None:
        gen_fair["sensitive"] = sensitive
    return resolved
