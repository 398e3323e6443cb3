"""Privacy core: accountants, calibration, zCDP conversion, events and the privacy ledger.

Small modules, each heavily tested:

* ``accountants`` -- Poisson-subsampled Gaussian (DP-SGD): PLD (default), RDP, PRV; calibration.
* ``gaussian``    -- plain Gaussian mechanism composed T times, exact (analytic Gaussian / GDP).
* ``zcdp``        -- rho-zCDP <-> (eps, delta), Canonne-Kamath-Steinke 2020.
* ``events``      -- what a stage did, as pydantic models.
* ``composition`` -- all events -> one (eps, delta), never by adding eps's.
* ``ledger``      -- SQLite ledger per run directory, with budget refusal before any spend.
"""

from dpsynth_core.privacy._validate import PrivacyParameterError, check_delta_for_size, default_delta
from dpsynth_core.privacy.accountants import ACCOUNTANTS, calibrate_noise_multiplier, epsilon_dpsgd
from dpsynth_core.privacy.composition import compose_epsilon, compose_with_details
from dpsynth_core.privacy.events import (
    DpSgdEvent,
    GaussianEvent,
    PostProcessingEvent,
    PrivacyEvent,
    SelectionEvent,
    ZCdpEvent,
    event_from_dict,
)
from dpsynth_core.privacy.gaussian import calibrate_gaussian_noise, gaussian_epsilon
from dpsynth_core.privacy.ledger import LEDGER_FILE, LedgerEntry, PrivacyLedger
from dpsynth_core.privacy.zcdp import epsilon_to_zcdp, zcdp_to_epsilon

__all__ = [
    "ACCOUNTANTS",
    "LEDGER_FILE",
    "DpSgdEvent",
    "GaussianEvent",
    "LedgerEntry",
    "PostProcessingEvent",
    "PrivacyEvent",
    "PrivacyLedger",
    "PrivacyParameterError",
    "SelectionEvent",
    "ZCdpEvent",
    "calibrate_gaussian_noise",
    "check_delta_for_size",
    "calibrate_noise_multiplier",
    "compose_epsilon",
    "compose_with_details",
    "default_delta",
    "epsilon_dpsgd",
    "epsilon_to_zcdp",
    "event_from_dict",
    "gaussian_epsilon",
    "zcdp_to_epsilon",
]
