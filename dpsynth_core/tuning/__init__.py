"""The privacy of hyperparameter tuning: a DP sweep's selection event, bounded before any trial runs.

* ``selection``: the sweep's privacy settings, its checks and the selection event (re-exported here);
* ``space``: search spaces drawn from OS entropy;
* ``plan``: the bound over the whole space from a method's planner;
* ``metrics``: which ranking metrics read no private data;
* ``release``: the best trial's release, rebuilt around the selection's ledger.
"""

from dpsynth_core.tuning.selection import (
    TuningPrivacy,
    check_sweep_allowed,
    draw_num_trials,
    repeat_and_select_epsilon,
    selection_event,
    single_trial_epsilon,
)

__all__ = [
    "TuningPrivacy",
    "check_sweep_allowed",
    "draw_num_trials",
    "repeat_and_select_epsilon",
    "selection_event",
    "single_trial_epsilon",
]
