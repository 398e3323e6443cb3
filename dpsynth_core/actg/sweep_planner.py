"""ACTG's planner for a DP sweep (``tuning.plan``): what one trial of a configuration would spend,
computed without reading data, with the calibration code the pipeline runs (AIM's rho, DP-SGD's noise
fitted to the ledger)."""

from __future__ import annotations

import tempfile

from dpsynth_core.errors import ConfigError
from dpsynth_core.tuning.plan import TrialPlan


class ActgPlanner:
    """ACTG-ARL: AIM under eps1 = features_share * epsilon (as ``zcdp``), then DP-SGD under what
    the ledger leaves (``fit_to_ledger``, with or without ``fill_budget``)."""

    privacy_free = ("rl.*", "generation.*", "best_of_n.*", "evaluation.*", "generator.learning_rate",
                    "generator.lora.*", "features.n_synthetic", "torch_threads")
    # AIM's rho grows with features_share while the generator's share shrinks; both grow with epsilon
    monotone = ("privacy.features_share", "privacy.epsilon")

    def plan(self, config: dict) -> TrialPlan:
        from dpsynth_core.actg.features import aim_rho
        from dpsynth_core.actg.pipeline import ActgConfig
        from dpsynth_core.dpsgd.budget import PrivacyPlan, fit_to_ledger
        from dpsynth_core.privacy import PrivacyLedger, ZCdpEvent, calibrate_noise_multiplier, default_delta

        cfg = ActgConfig.model_validate(config)
        n = cfg.data.n_records  # the training units the pipeline's DP-SGD plan counts
        delta = cfg.privacy.delta or default_delta(n)
        dp = cfg.dpsgd_config(cfg.epsilon_generator)
        if dp.expected_batch_size > n:
            raise ConfigError(f"generator.expected_batch_size {dp.expected_batch_size} > data.n_records {n}")
        events = []
        with tempfile.TemporaryDirectory() as scratch:
            ledger = PrivacyLedger.create(scratch, dataset=cfg.name, epsilon_budget=cfg.privacy.epsilon, delta=delta)
            if cfg.mode == "actg":
                aim = ZCdpEvent(rho=aim_rho(cfg.epsilon_features, delta))
                ledger.record("features", aim)
                events.append(aim)
            q = dp.expected_batch_size / n
            sigma = float(calibrate_noise_multiplier(dp.epsilon, delta, q, dp.steps, accountant=dp.accountant))
            plan = PrivacyPlan(noise_multiplier=sigma, sampling_rate=q, delta=delta, steps=dp.steps, n_units=n,
                               user_level=False, target_epsilon=dp.epsilon, accountant=dp.accountant)
            plan = fit_to_ledger(plan, ledger, fill=dp.fill_budget)
            ledger.check("dp_generator", plan.event())  # a point the pipeline would refuse is refused here
            events.append(plan.event())
        return TrialPlan(events=tuple(events), delta=float(delta), dataset=cfg.name)
