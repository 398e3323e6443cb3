"""epsilon = inf is a reference run only when the config says so, and the ledger carries the mark."""

import math

import pytest

from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy.ledger import PrivacyLedger
from dpsynth_core.privacy.reference_runs import check_reference_config, mark_reference_run


def test_infinite_epsilon_is_refused_without_not_private():
    with pytest.raises(ConfigError, match="not_private: true"):
        check_reference_config(math.inf, not_private=False)


def test_not_private_with_a_finite_epsilon_is_refused():
    with pytest.raises(ConfigError, match="reference runs"):
        check_reference_config(4.0, not_private=True)


def test_allowed_reference_run_marks_the_ledger(tmp_path):
    check_reference_config(math.inf, not_private=True)
    ledger = PrivacyLedger.create(tmp_path, "private", epsilon_budget=1.0, delta=1e-5)
    assert mark_reference_run(ledger, "reference", math.inf)
    assert not ledger.is_private
    assert "epsilon = inf" in ledger.not_private_reasons()[0]["reason"]


def test_a_private_run_is_not_marked(tmp_path):
    ledger = PrivacyLedger.create(tmp_path, "private", epsilon_budget=1.0, delta=1e-5)
    assert not mark_reference_run(ledger, "reference", 4.0)
    assert ledger.is_private
