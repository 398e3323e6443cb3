"""The vLLM tests run wherever `make install` put vLLM in the environment. Where it could not (the install
said so in one line), they skip with that reason, except under CI (CI=true), where they fail: CI must
never pass with the vLLM path unchecked."""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_vllm(*modules: str) -> None:
    missing = [m for m in ("vllm", *modules) if importlib.util.find_spec(m) is None]
    if not missing:
        return
    reason = f"{', '.join(missing)} not importable: `make install` installs vLLM (scripts/install_vllm.sh)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason)
