"""Anchored RL: gamma schedules, the RLOO + gamma*SFT update, and no handle on private data."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from rl_reference import anchored_rl_step, load_trainable_policy, rloo_advantages

from dpsynth_core.actg.anchored_rl import (
    AnchoredRLConfig,
    RLArtifacts,
    assert_no_private_paths,
    run_anchored_rl,
)
from dpsynth_core.actg.anchored_rl_base import GammaSchedule
from dpsynth_core.actg.generator import format_prompt, load_prompt_template
from dpsynth_core.actg.schema import schema_from_dict
from dpsynth_core.errors import DataError

SCHEMA = {"name": "mini", "description": "toy", "fields": [
    {"name": "topic", "description": "Topic", "options": ["Neuroscience", "Ecology", "Genomics"]},
    {"name": "organism", "description": "Organism", "options": ["Mouse/Rat", "Human", "Plant"]},
]}

# --- audit every file this process opens (used by the no-private-data test) -----------------
_OPENED: list[str] | None = None


def _audit(event: str, args) -> None:
    if _OPENED is not None and event == "open" and args and isinstance(args[0], (str, bytes, Path)):
        _OPENED.append(str(args[0] if not isinstance(args[0], bytes) else args[0].decode(errors="replace")))


sys.addaudithook(_audit)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> RLArtifacts:
    """Public/DP artifacts only: schema, a synthetic attribute table, anchors, a LoRA adapter."""
    from peft import LoraConfig, get_peft_model

    from dpsynth_core.models import load_causal_lm

    root = tmp_path_factory.mktemp("rl_artifacts")
    schema = schema_from_dict(SCHEMA)
    schema.save(root / "schema.yaml")
    rows = [{"topic": t, "organism": o} for t in ["Neuroscience", "Ecology", "Genomics"] for o in ["Human", "Plant"]]
    (root / "features.csv").write_text("topic,organism\n" + "".join(f"{r['topic']},{r['organism']}\n" for r in rows))
    anchors = [{"attributes": r, "text": f"We study {r['topic'].lower()} in {r['organism'].lower()} samples."}
               for r in rows]
    (root / "anchors.jsonl").write_text("".join(json.dumps(a) + "\n" for a in anchors))
    base, _ = load_causal_lm("tiny-llama")
    torch.manual_seed(0)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # non-zero B so that both LoRA factors get gradients
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    peft_model.save_pretrained(root / "adapter")
    return RLArtifacts(schema_path=root / "schema.yaml", attributes_path=root / "features.csv",
                       anchors_path=root / "anchors.jsonl", base_model="tiny-llama", adapter_dir=root / "adapter",
                       prompt_template=load_prompt_template("conditional"), text_description="abstract",
                       extractor={"kind": "embedding"})


def test_gamma_schedules_hit_reference_values():
    lin = GammaSchedule(2.0, 0.2, total_steps=11, kind="linear")
    assert lin(0) == pytest.approx(2.0) and lin(10) == pytest.approx(0.2)
    assert lin(5) == pytest.approx(1.1)
    assert [round(lin(t), 6) for t in range(11)] == sorted([round(lin(t), 6) for t in range(11)], reverse=True)
    cos = GammaSchedule(2.0, 0.2, total_steps=11, kind="cosine")
    assert cos(0) == pytest.approx(2.0) and cos(10) == pytest.approx(0.2) and cos(5) == pytest.approx(1.1)
    assert cos(2) > lin(2)  # slow start
    step = GammaSchedule(2.0, 0.2, total_steps=10, kind="step", step_at=0.5)
    assert step(4) == 2.0 and step(5) == 0.2
    assert GammaSchedule(2.0, 0.2, total_steps=1)(0) == 2.0
    assert AnchoredRLConfig().gamma_schedule()(0) == 2.0  # the reference defaults


def test_rloo_advantages_leave_one_out():
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.5, 0.2, 0.2, 0.2]), 3)
    assert adv.tolist() == pytest.approx([0.75, -0.75, 0.0, 0.0, 0.0, 0.0])
    adv2 = rloo_advantages(torch.tensor([1.0, 0.0, 0.3, 0.3]), 2)
    assert adv2.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0])


def _step_delta(artifacts: RLArtifacts, gamma: float, reward_fn, seed: int = 3) -> dict[str, torch.Tensor]:
    """Parameter change of one anchored-RL step from the same start, same samples."""
    from dpsynth_core.dpsgd import TrainExample

    torch.manual_seed(0)
    policy, tok = load_trainable_policy(artifacts.base_model, artifacts.adapter_dir)
    schema = schema_from_dict(SCHEMA)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    targets = [{"topic": "Ecology", "organism": "Plant"}, {"topic": "Genomics", "organism": "Human"}]
    prompts = [format_prompt(schema, t, artifacts.prompt_template, text_description="abstract") for t in targets]
    anchors = [TrainExample(prompt=prompts[0], target=" Plants in ecology."),
               TrainExample(prompt=prompts[1], target=" Human genomes.")]
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    cfg = AnchoredRLConfig(group_size=3, max_new_tokens=8, max_seq_len=128, beta=0.0)
    stats = anchored_rl_step(policy, tok, opt, prompts=prompts, targets=targets, anchor_examples=anchors,
                             gamma=gamma, reward_fn=reward_fn, config=cfg, seed=seed)
    assert math.isfinite(stats["loss"]) and stats["gamma"] == gamma
    return {n: p.detach() - before[n] for n, p in policy.named_parameters() if p.requires_grad}


def _length_reward(texts, targets):
    return [len(t) / 50.0 for t in texts]  # varies across samples -> non-zero advantages


def test_rl_update_is_a_policy_gradient_and_uses_the_sft_term(artifacts):
    pure_rl = _step_delta(artifacts, 0.0, _length_reward)
    anchored = _step_delta(artifacts, 2.0, _length_reward)
    assert max(d.abs().max().item() for d in pure_rl.values()) > 0  # the RL term alone moves the policy
    diff = max((pure_rl[n] - anchored[n]).abs().max().item() for n in pure_rl)
    assert diff > 1e-6  # same samples, same rewards: only the gamma*SFT term differs
    # equal rewards -> zero RLOO advantages -> no gradient without the anchor term
    flat = _step_delta(artifacts, 0.0, lambda texts, targets: [0.5] * len(texts))
    assert max(d.abs().max().item() for d in flat.values()) == 0.0


def test_rl_artifacts_are_only_public_or_dp_outputs(artifacts, tmp_path):
    assert set(RLArtifacts.model_fields) == {"schema_path", "attributes_path", "anchors_path", "base_model",
                                             "adapter_dir", "prompt_template", "text_description", "extractor"}
    with pytest.raises(Exception):
        RLArtifacts(**artifacts.model_dump(), private_texts=["x"])  # extra inputs are refused
    # an artifact inside the private data directory is refused
    private = tmp_path / "private"
    private.mkdir()
    (private / "features.csv").write_text(artifacts.attributes_path.read_text())
    leaked = artifacts.model_copy(update={"attributes_path": private / "features.csv"})
    with pytest.raises(DataError, match="private data directory"):
        assert_no_private_paths(leaked, private)


def test_rl_stage_never_opens_the_private_data(artifacts, tmp_path, monkeypatch):
    global _OPENED
    private = tmp_path / "private_data"
    (private / "biorxiv").mkdir(parents=True)
    secret = private / "biorxiv" / "biorxiv_1500.csv"
    secret.write_text("doi,title,abstract\n1,t,PRIVATE RECORD\n")
    secret.chmod(0)  # unreadable for non-root users; the audit below also covers root
    monkeypatch.setenv("DPSYNTH_DATA_DIR", str(private))
    cfg = AnchoredRLConfig(steps=2, prompts_per_step=2, group_size=2, anchor_batch_size=2, max_new_tokens=8,
                           max_seq_len=128)
    _OPENED = []
    try:
        result = run_anchored_rl(artifacts, cfg, tmp_path / "rl", progress=False)
        opened = list(_OPENED)
    finally:
        _OPENED = None
        secret.chmod(0o600)
    assert [h["step"] for h in result.history] == [1, 2]
    assert result.history[0]["gamma"] == pytest.approx(2.0) and result.history[1]["gamma"] == pytest.approx(0.2)
    assert (result.adapter_dir / "adapter_config.json").is_file()
    assert any(str(artifacts.anchors_path) in p for p in opened)  # the audit does see the stage's reads
    assert not [p for p in opened if str(private) in str(Path(p).resolve())]


def _adapter_delta(artifacts: RLArtifacts, adapter_dir: Path) -> float:
    from safetensors.torch import load_file

    before = load_file(str(artifacts.adapter_dir / "adapter_model.safetensors"))
    after = load_file(str(adapter_dir / "adapter_model.safetensors"))
    return max((after[k].float() - before[k].float()).abs().max().item() for k in before)


def test_trl_engine_adds_the_anchor_term_to_rloo(artifacts, tmp_path):
    """engine=trl is trl.RLOOTrainer + gamma*SFT: with tied rewards (zero RLOO advantages) only the
    anchor term can move the policy, so gamma=0 leaves the adapter unchanged and gamma>0 does not."""
    flat = lambda texts, targets: [0.5] * len(texts)  # noqa: E731
    common = dict(steps=1, prompts_per_step=2, group_size=2, anchor_batch_size=2, max_new_tokens=6,
                  max_seq_len=128, learning_rate=1e-2, engine="trl")
    no_anchor = run_anchored_rl(artifacts, AnchoredRLConfig(gamma0=0.0, gamma1=0.0, **common), tmp_path / "g0",
                                reward_fn=flat, progress=False)
    anchored = run_anchored_rl(artifacts, AnchoredRLConfig(gamma0=2.0, gamma1=2.0, **common), tmp_path / "g2",
                               reward_fn=flat, progress=False)
    assert _adapter_delta(artifacts, no_anchor.adapter_dir) == 0.0
    assert _adapter_delta(artifacts, anchored.adapter_dir) > 1e-6
    h = anchored.history[0]
    assert h["gamma"] == pytest.approx(2.0) and h["sft_loss"] > 0 and h["reward"] == pytest.approx(0.5)
    assert not (tmp_path / "g2" / ".trl").exists()  # trl's scratch directory is cleaned up
    # KL (default beta 0.2) is to the DP generator: trl's frozen "ref" copy of the DP adapter, so it is
    # exactly 0 at the first step; the reference copy is not saved with the policy's adapter
    assert no_anchor.history[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert not (no_anchor.adapter_dir / "ref").exists()


def test_kl_term_is_to_the_dp_generator_and_enters_the_reward(artifacts):
    """beta > 0: the reward is penalised by KL(policy || DP generator). At the start the policy IS
    the DP generator (KL exactly 0); once its weights move, the KL is non-zero and changes the update."""
    from rl_reference import kl_to_reference, sample_completions

    torch.manual_seed(0)
    policy, tok = load_trainable_policy(artifacts.base_model, artifacts.adapter_dir, with_reference=True)
    assert not any(p.requires_grad for n, p in policy.named_parameters() if ".ref." in n)  # the reference is frozen
    cfg = AnchoredRLConfig(group_size=2, max_new_tokens=8, max_seq_len=128, beta=0.2)
    seqs, width, mask, attn, _ = sample_completions(policy, tok, ["Write an abstract."] * 2, cfg, seed=1)
    assert kl_to_reference(policy, seqs, attn, width, mask).abs().max().item() == 0.0
    with torch.no_grad():  # move the trainable copy only
        for n, p in policy.named_parameters():
            if "lora_B" in n and ".default." in n:
                p.add_(0.5)
    kl = kl_to_reference(policy, seqs, attn, width, mask)
    assert kl.abs().max().item() > 1e-3
    # flat task reward: without KL no advantage; with KL the (unequal) penalties give one
    flat = [0.5, 0.5]
    assert rloo_advantages(torch.tensor(flat), 2).abs().max().item() == 0.0
    assert rloo_advantages(torch.tensor(flat) - 0.2 * kl, 2).abs().max().item() > 0.0
    # the torch engine's step subtracts beta * KL from the reward: flat rewards still move the policy
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    stats = anchored_rl_step(policy, tok, opt, prompts=["Write an abstract."], targets=[{}], anchor_examples=[],
                             gamma=0.0, reward_fn=lambda t, a: [0.5] * len(t), config=cfg, seed=1)
    assert stats["kl"] != 0.0 and stats["grad_norm"] > 0.0
    # beta > 0 without the reference adapter is refused (never silently KL to the base model)
    bare, _ = load_trainable_policy(artifacts.base_model, artifacts.adapter_dir)
    with pytest.raises(DataError, match="reference adapter"):
        kl_to_reference(bare, seqs, attn, width, mask)



def test_trl_engine_takes_the_update_of_the_plain_torch_reference(artifacts, tmp_path):
    """One step of the trl engine and one of the plain-torch reference (tests/rl_reference.py) from the same
    DP adapter, with tied rewards (zero RLOO advantages), beta 0 and a single anchor: both updates are then
    AdamW's first step on gamma * SFT(anchor), so they must move every LoRA weight alike (measured: all 1,792
    within 7.5e-6 x lr, docs/results/rl_engine_reference.md). Adam's first step is about +-lr per weight: this
    checks the sign of every weight's gradient and the learning rate, not gamma's scale (tested above)."""
    from safetensors.torch import load_file

    from dpsynth_core.dpsgd import TrainExample

    first = artifacts.anchors_path.read_text().splitlines()[0]
    (tmp_path / "one.jsonl").write_text(first + "\n")
    single = artifacts.model_copy(update={"anchors_path": tmp_path / "one.jsonl"})
    lr = 1e-3
    cfg = AnchoredRLConfig(steps=1, prompts_per_step=2, group_size=2, anchor_batch_size=1, max_new_tokens=6,
                           max_seq_len=128, learning_rate=lr, beta=0.0, gamma0=2.0, gamma1=2.0)
    flat = lambda texts, targets: [0.5] * len(texts)  # noqa: E731
    trl_adapter = run_anchored_rl(single, cfg, tmp_path / "trl", reward_fn=flat, progress=False).adapter_dir

    anchor = json.loads(first)
    prompt = format_prompt(schema_from_dict(SCHEMA), anchor["attributes"], single.prompt_template,
                           text_description=single.text_description)
    policy, tok = load_trainable_policy(single.base_model, single.adapter_dir)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    anchored_rl_step(policy, tok, opt, prompts=[prompt] * 2, targets=[anchor["attributes"]] * 2,
                     anchor_examples=[TrainExample(prompt=prompt, target=" " + anchor["text"].strip())],
                     gamma=2.0, reward_fn=flat, config=cfg, seed=0)
    policy.save_pretrained(str(tmp_path / "reference"), selected_adapters=["default"])

    start = load_file(str(artifacts.adapter_dir / "adapter_model.safetensors"))
    by_trl = load_file(str(trl_adapter / "adapter_model.safetensors"))
    by_ref = load_file(str(tmp_path / "reference" / "adapter_model.safetensors"))
    assert set(by_trl) == set(by_ref) == set(start)
    d_trl = torch.cat([(by_trl[k].float() - start[k].float()).flatten() for k in sorted(start)])
    d_ref = torch.cat([(by_ref[k].float() - start[k].float()).flatten() for k in sorted(start)])
    assert d_ref.abs().max() > 0.5 * lr  # the anchor term moved the reference (Adam's first step: ~lr per weight)
    apart = (d_trl - d_ref).abs() > 1e-3 * lr
    assert not apart.any(), f"{int(apart.sum())} of {apart.numel()} LoRA weights moved differently"


def test_the_removed_torch_engine_is_refused_with_exit_2_naming_the_key(tmp_path, monkeypatch, capsys):
    import yaml
    from cli_in_process import dpsynth

    run_dir = tmp_path / "run"
    cfg = tmp_path / "actg.yaml"
    cfg.write_text(yaml.safe_dump({"run_dir": str(run_dir), "rl": {"engine": "torch"}}))
    code, out = dpsynth(monkeypatch, capsys, "run", "actg", "--config", str(cfg))
    assert code == 2
    assert "field 'rl.engine': the plain-torch RL engine was removed" in out
    assert not run_dir.exists()


def test_the_trl_trainer_is_imported_without_vllm():
    """trl imports an installed vLLM (~3 s a process) for a generation path the RL stage never runs: hidden from
    trl's check while its modules load, then the check is put back (a fresh process: this one may hold vLLM)."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed: nothing for trl to import")
    code = ("import sys; from dpsynth_core.actg.anchored_rl_trl import _trl_rloo; import trl.import_utils as u; "
            "config, trainer = _trl_rloo(); "
            "print(trainer.__name__, config.__name__, 'vllm' in sys.modules, u.is_vllm_available())")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["RLOOTrainer", "RLOOConfig", "False", "True"]


def test_the_rl_stage_worker_reaches_no_data_dir_and_serves_every_run(ray_session, tmp_path):
    """ray_jobs.actg runs the isolated stage where data_dir() fails, in a worker no other stage shares; its
    runtime environment is the same for every run, so a second run's RL stage finds a warm worker."""
    from dpsynth_core.actg.pipeline import ActgConfig
    from ray_jobs.actg import ray_runner

    def stage_anchored_rl(cfg, root):  # nested: pickled by value into the worker
        import os

        from dpsynth_core.data import data_dir

        try:
            data_dir()
            reached = True
        except DataError:
            reached = False
        return {"reached": reached, "pid": os.getpid()}

    def stage_evaluate(cfg, root):
        import os

        return {"pid": os.getpid()}

    cfg = ActgConfig()
    first = ray_runner(stage_anchored_rl, cfg, str(tmp_path / "a"), isolated=True)
    other_stage = ray_runner(stage_evaluate, cfg, str(tmp_path / "a"))
    second = ray_runner(stage_anchored_rl, cfg, str(tmp_path / "b"), isolated=True)
    assert not first["reached"] and not second["reached"]
    assert other_stage["pid"] != first["pid"]
    assert second["pid"] == first["pid"]
