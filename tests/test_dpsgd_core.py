"""DP-SGD engine: per-sample gradients, clipping, noise scale, masking, sampling, ledger, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from dpsynth_core.dpsgd import DpSgdConfig, TrainExample, train_dp_lora
from dpsynth_core.dpsgd.clipping import make_clipper
from dpsynth_core.dpsgd.data import IGNORE_INDEX, collate, per_example_loss, tokenize_examples
from dpsynth_core.dpsgd.engine import DistContext, build_lora_model, privatize_and_reduce
from dpsynth_core.dpsgd.sampling import PoissonSampler
from dpsynth_core.errors import BudgetExceededError, ConfigError

torch.set_num_threads(2)
EXAMPLES = [TrainExample(f"Topic {i % 3}:\n", f"text number {i} " * (1 + i % 4)) for i in range(40)]


@pytest.fixture(scope="module")
def tiny():
    cfg = DpSgdConfig(model="tiny-llama", epsilon=1.0, steps=1, device="cpu")
    model, tok = build_lora_model(cfg, torch.device("cpu"))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.2)  # non-zero so lora_A gets gradients too
    return model, tok


def _batch(tok, n=4):
    return collate(tokenize_examples(EXAMPLES[:n], tok, 48), tok.pad_token_id)


def _losses(module, b):
    out = module(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
    return per_example_loss(out.logits, b["labels"])


def test_labels_masked_on_prompt_and_padding(tiny):
    _, tok = tiny
    rows = tokenize_examples(EXAMPLES[:4], tok, 48)
    b = collate(rows, tok.pad_token_id)
    for i, r in enumerate(rows):
        n = len(r.prompt_ids) + len(r.target_ids)
        assert (b["labels"][i, : len(r.prompt_ids)] == IGNORE_INDEX).all()
        assert b["labels"][i, len(r.prompt_ids) : n].tolist() == r.target_ids
        assert (b["labels"][i, n:] == IGNORE_INDEX).all() and (b["attention_mask"][i, n:] == 0).all()
        assert b["position_ids"][i, :n].tolist() == list(range(n))
    assert r.target_ids[-1] == tok.eos_token_id  # pad == eos: masked by attention mask, not by id


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_per_sample_clipping_matches_manual_loop(tiny, mode):
    model, tok = tiny
    b = _batch(tok)
    params = [p for p in model.parameters() if p.requires_grad]
    manual = [torch.autograd.grad(_losses(model, {k: v[i : i + 1] for k, v in b.items()}).sum(), params) for i in range(4)]
    norms = torch.stack([torch.sqrt(sum((g**2).sum() for g in gs)) for gs in manual])
    C = float(norms.median())  # some rows clipped, some not
    clipper = make_clipper(mode, model, C)
    try:
        bufs = [torch.zeros_like(p) for p in params]
        clipper.accumulate(_losses(clipper.module, b), torch.arange(4), 4, bufs)
    finally:
        clipper.module._close() if hasattr(clipper.module, "_close") else None
    assert torch.allclose(clipper.last_norms, norms, rtol=1e-4, atol=1e-6)
    factors = (C / (norms + 1e-6)).clamp(max=1.0)
    for j, buf in enumerate(bufs):
        expect = sum(factors[i] * manual[i][j] for i in range(4))
        assert torch.allclose(buf, expect, atol=1e-5)
    clipped = [torch.sqrt(sum(((factors[i] * g) ** 2).sum() for g in manual[i])) for i in range(4)]
    assert max(clipped) <= C * (1 + 1e-5)


def test_noise_has_std_sigma_c_and_is_added_once():
    sigma, C, B = 1.7, 0.5, 8
    g = torch.Generator().manual_seed(0)
    out = privatize_and_reduce(torch.zeros(200_000), noise_multiplier=sigma, max_grad_norm=C, expected_batch_size=B,
                               dist=DistContext(0, 1), generator=g)
    z = (out * B / (sigma * C)).numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.std() - 1) < 0.01
    # a non-zero rank adds no noise: summed over ranks, noise is there exactly once
    other = privatize_and_reduce(torch.zeros(10), noise_multiplier=sigma, max_grad_norm=C, expected_batch_size=B,
                                 dist=DistContext(1, 1), generator=None)
    assert torch.count_nonzero(other) == 0


def test_rank_consistent_sampler_steps_and_shards():
    s = PoissonSampler(10, 2, seed=5)
    empties = 0
    for step in range(50):
        full = s.sample(step)
        shards = [s.local_units(step, r, 3) for r in range(3)]
        assert sorted(np.concatenate(shards).tolist()) == full.tolist()
        empties += sum(len(x) == 0 for x in shards)
    assert empties > 0  # empty local batches happen, yet every rank has a step for every index
    counts = [np.mean([len(s.sample(t)) for t in range(2000)])]
    assert counts[0] == pytest.approx(2, rel=0.1)


def _cfg(**kw):
    base = dict(model="tiny-llama", epsilon=2.0, delta=1e-3, steps=4, expected_batch_size=6, physical_batch_size=4,
                clipping="hooks", sampling_seed=3, learning_rate=1e-2, device="cpu")
    base.update(kw)
    return DpSgdConfig(**base)


def test_train_changes_lora_only_and_records_ledger(tmp_path):
    from safetensors.torch import load_file

    from dpsynth_core.models import load_causal_lm
    from dpsynth_core.privacy import PrivacyLedger

    ledger = PrivacyLedger.create(tmp_path, "toy", 5.0, 1e-3)
    res = train_dp_lora(EXAMPLES, _cfg(clipping="ghost"), output_dir=tmp_path / "out", ledger=ledger, progress=False)
    assert res.steps == 4 and res.epsilon <= 2.0 + 1e-9 and res.epsilon > 1.5
    assert ledger.total_epsilon() == pytest.approx(res.epsilon, rel=1e-6)
    assert len(ledger.entries()) == 1
    lora = load_file(str(res.adapter_dir / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in lora.items())  # B starts at 0
    assert all("lora_" in k for k in lora)  # only adapter weights leave the run
    assert (tmp_path / "out" / "training_curve.png").stat().st_size > 1000
    # the released adapter dir: weights + privacy summary; no loss (measured on private batches, not
    # noised), no secret sampling seed; the resumable checkpoint (which holds the seed) is gone
    released = {f.name: f.read_bytes() for f in res.adapter_dir.rglob("*") if f.is_file()}
    assert "adapter_model.safetensors" in released and "dp_training.json" in released
    assert not any(b"sampling_seed" in data or b'"loss"' in data for data in released.values())
    assert [d.name for d in (tmp_path / "out").iterdir() if d.is_dir()] == [res.adapter_dir.name]
    from dpsynth_core.dpsgd import load_generator

    model, _ = load_generator("tiny-llama", res.adapter_dir)
    base, _ = load_causal_lm("tiny-llama")
    trained = dict(model.get_base_model().named_parameters())
    for name, p in base.named_parameters():
        key = name.replace("q_proj.weight", "q_proj.base_layer.weight").replace("v_proj.weight", "v_proj.base_layer.weight")
        assert torch.equal(trained[key], p), name


def test_kill_and_resume_matches_uninterrupted(tmp_path):
    from safetensors.torch import load_file

    from dpsynth_core.privacy import PrivacyLedger

    full = train_dp_lora(EXAMPLES, _cfg(), output_dir=tmp_path / "full", progress=False)
    ledger = PrivacyLedger.create(tmp_path / "run", "toy", 5.0, 1e-3)
    part = train_dp_lora(EXAMPLES, _cfg(checkpoint_every=2, stop_after_steps=3), output_dir=tmp_path / "res",
                         ledger=ledger, progress=False)
    assert not part.completed and ledger.entries() == []  # nothing recorded for an unfinished run
    done = train_dp_lora(EXAMPLES, _cfg(checkpoint_every=2), output_dir=tmp_path / "res", ledger=ledger, progress=False)
    assert done.steps == full.steps == 4
    assert ledger.total_epsilon() == pytest.approx(full.epsilon, rel=1e-9) and len(ledger.entries()) == 1
    a = load_file(str(full.adapter_dir / "adapter_model.safetensors"))
    b = load_file(str(done.adapter_dir / "adapter_model.safetensors"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6


def test_bad_configs_fail_before_training(tmp_path):
    from dpsynth_core.privacy import PrivacyLedger

    with pytest.raises(ValueError, match="epsilon"):
        _cfg(epsilon=0)
    with pytest.raises(ConfigError, match="delta"):
        train_dp_lora(EXAMPLES, _cfg(delta=0.1), output_dir=tmp_path / "a", progress=False)
    with pytest.raises(ConfigError, match="expected_batch_size"):
        train_dp_lora(EXAMPLES, _cfg(expected_batch_size=41), output_dir=tmp_path / "b", progress=False)
    with pytest.raises(ConfigError, match="q_prj"):
        train_dp_lora(EXAMPLES, _cfg(lora={"target_modules": ["q_prj"]}), output_dir=tmp_path / "c", progress=False)
    ledger = PrivacyLedger.create(tmp_path, "toy", 1.0, 1e-3)
    with pytest.raises(BudgetExceededError):
        train_dp_lora(EXAMPLES, _cfg(epsilon=2.0), output_dir=tmp_path / "d", ledger=ledger, progress=False)
    assert not (tmp_path / "d").exists()


def test_noise_is_raised_when_composition_with_the_ledger_would_exceed_the_budget(tmp_path):
    """eps1 (AIM, zCDP) + eps2 (DP-SGD) can compose to more than eps1 + eps2 at one delta: the
    plan raises sigma until the ledger's composed total fits, and never lowers it."""
    from dpsynth_core.dpsgd.budget import plan_privacy
    from dpsynth_core.privacy import PrivacyLedger, ZCdpEvent, epsilon_to_zcdp

    examples = [TrainExample(prompt=f"p{i}", target=f" t{i}") for i in range(32)]
    ledger = PrivacyLedger.create(tmp_path, dataset="toy", epsilon_budget=4.0, delta=9e-3)
    ledger.record("aim", ZCdpEvent(rho=epsilon_to_zcdp(1.3, 9e-3)))
    cfg = DpSgdConfig(model="tiny-llama", epsilon=2.7, steps=3, expected_batch_size=8, device="cpu", delta=9e-3)
    alone = plan_privacy(cfg, examples)
    fitted = plan_privacy(cfg, examples, ledger=ledger)
    assert ledger.projected_epsilon(alone.event()) > 4.0  # the naive split overshoots
    assert fitted.noise_multiplier > alone.noise_multiplier
    assert 4.0 * 0.99 < ledger.projected_epsilon(fitted.event()) <= 4.0
    roomy = PrivacyLedger.create(tmp_path / "roomy", dataset="toy", epsilon_budget=8.0, delta=9e-3)
    assert plan_privacy(cfg, examples, ledger=roomy).noise_multiplier == alone.noise_multiplier


def test_fill_budget_lowers_noise_until_the_composed_total_reaches_the_budget(tmp_path):
    """Two Gaussian stages then DP-SGD at "what is left": PLD composition is sub-additive, so the
    plain plan leaves budget unspent; fill_budget lowers sigma until the total reaches it, never above."""
    from dpsynth_core.dpsgd.budget import plan_privacy
    from dpsynth_core.privacy import GaussianEvent, PrivacyLedger

    examples = [TrainExample(prompt=f"p{i}", target=f" t{i}") for i in range(64)]
    ledger = PrivacyLedger.create(tmp_path, dataset="toy", epsilon_budget=3.0, delta=1e-4)
    ledger.record("domain", GaussianEvent(noise_multiplier=20.0))
    ledger.record("fair_stats", GaussianEvent(noise_multiplier=20.0))
    left = ledger.remaining_epsilon() * 0.995
    plain = plan_privacy(DpSgdConfig(model="tiny-llama", epsilon=left, steps=4, expected_batch_size=8, device="cpu"), examples, ledger=ledger)
    filled = plan_privacy(DpSgdConfig(model="tiny-llama", epsilon=left, steps=4, expected_batch_size=8, device="cpu", fill_budget=True),
                          examples, ledger=ledger)
    assert ledger.projected_epsilon(plain.event()) < 3.0 * 0.98  # what plain subtraction leaves unspent
    assert filled.noise_multiplier < plain.noise_multiplier
    assert 3.0 * 0.995 <= ledger.projected_epsilon(filled.event()) <= 3.0
    assert filled.target_epsilon == pytest.approx(filled.epsilon_after(4))  # the stage's own figure, reported as is


def test_run_steps_reports_the_drivers_epsilons_and_computes_none(monkeypatch):
    """A Ray Train driver hands its workers the plan's epsilons (epsilon_schedule): the workers' run_steps
    reports those and needs no accountant; the schedule is what the plan computes."""
    from dpsynth_core.dpsgd.budget import PrivacyPlan
    from dpsynth_core.dpsgd.trainer import epsilon_schedule, new_train_state, run_steps

    plan = PrivacyPlan(noise_multiplier=5.0, sampling_rate=1.0, delta=1e-5, steps=20, n_units=40, user_level=False,
                       target_epsilon=2.0, accountant="pld")
    schedule = epsilon_schedule(plan, start_step=5)
    assert list(schedule) == [5, 6, 8, 10, 12, 14, 16, 18, 20]  # the resumed step, then each due step
    assert schedule == {s: plan.epsilon_after(s) for s in schedule}

    class Engine:
        step = 5

        def train_step(self):
            self.step += 1
            return {"step": self.step, "loss": 0.5}

    monkeypatch.setattr(PrivacyPlan, "epsilon_after", lambda *a: pytest.fail("a worker computed an epsilon"))
    state = new_train_state(7, plan, "fingerprint")
    assert run_steps(Engine(), plan, state, _cfg(steps=20), on_checkpoint=None, progress=False, epsilons=schedule)
    assert {r["step"]: r["epsilon"] for r in state.history if r["epsilon"] is not None} == {
        s: e for s, e in schedule.items() if s > 5}


def test_fill_budget_checks_its_search_on_the_exact_composition(tmp_path):
    """fill_budget searches on the ledger's faster upper bound: a bound that reads low (0.97: rounding) never takes
    the total over the budget, and a loose one (1.02) still ends within rel_tol of it, both checked exactly."""
    from dpsynth_core.dpsgd.budget import PrivacyPlan, fit_to_ledger
    from dpsynth_core.privacy import GaussianEvent, PrivacyLedger

    ledger = PrivacyLedger.create(tmp_path, dataset="toy", epsilon_budget=3.0, delta=1e-5)
    ledger.record("domain", GaussianEvent(noise_multiplier=20.0))

    class SkewedBound:
        def __init__(self, error: float) -> None:
            self.error = error

        def __getattr__(self, name):
            return getattr(ledger, name)

        def projected_epsilon(self, event, upper_bound=False):
            exact = ledger.projected_epsilon(event)
            return exact * self.error if upper_bound else exact

    # sampling rate 1: a plain Gaussian per step, whose PLD is quick to build
    plan = PrivacyPlan(noise_multiplier=3.0, sampling_rate=1.0, delta=1e-5, steps=2, n_units=16, user_level=False,
                       target_epsilon=1.0, accountant="pld")
    assert ledger.projected_epsilon(plan.event()) < 3.0 * 0.9  # budget left unspent: fill lowers the noise
    for error in (0.97, 1.02):
        filled = fit_to_ledger(plan, SkewedBound(error), fill=True)
        assert filled.noise_multiplier < plan.noise_multiplier
        assert 3.0 * (1 - 3e-3) <= ledger.projected_epsilon(filled.event()) <= 3.0, error
