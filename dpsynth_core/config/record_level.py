"""The ``data`` section of a method whose unit of privacy is one record (ACTG, WASP / Aug-PE, DPFairLLM, AIM).

``data.user_col`` belongs only to a method that bounds a user's contribution (``dpsynth train``:
user-level DP-SGD). Elsewhere it would look like a user-level guarantee that the method does not
give, so it is refused when the config is loaded, naming the key (exit 2), not ignored.
"""

from __future__ import annotations

from pydantic import model_validator

from dpsynth_core.config.strict import StrictConfig

USER_LEVEL_KEYS = ("user_col", "user_column")


class RecordLevelData(StrictConfig):
    """Base of a record-level method's ``data`` section."""

    @model_validator(mode="before")
    @classmethod
    def _no_user_column(cls, values):
        if isinstance(values, dict):
            for key in USER_LEVEL_KEYS:
                if key in values:
                    raise ValueError(
                        f"data.{key}: this method protects one record (a row of the file), not a user; only "
                        "`dpsynth train` bounds a user's contribution (user-level DP-SGD). Remove the key")
        return values
