"""Trainable partners: rewards, Co-Training, self-play, the population pool and its checkpointing."""
import json
import math
import random

import pytest
import torch

from scope.config import ConfigError, parse_config
from scope.learner import Learner, LearnerConfig, group_advantages
from scope.models.backend import ModelRef
from scope.models.loading import load_tokenizer, tiny_backend
from scope.partners.pool import PoolSource
from scope.partners.rewards import (PARTNER_REWARDS, apply_partner_reward, curriculum_value, register_reward)
from scope.partners.binding import Binding
from scope.rollout import Job, run_rollouts
from scope.run import read_metrics
from scope.train import train
from scope.envs.base import get_env
from scope.types import Episode, SamplingParams, Task

SP = SamplingParams(temperature=1.0, max_new_tokens=8)


def eps_with(groups):
    out = []
    for gid, rs in groups.items():
        for i, r in enumerate(rs):
            out.append(Episode(gid, gid, i, rewards={"agent": r}, status="done"))
    return out


def test_curriculum_reward_at_known_variances():
    eps = eps_with({"half": [1.0, 0.0], "same": [1.0, 1.0], "quarter": [1.0, 0.0, 0.0, 0.0]})
    apply_partner_reward("curriculum", eps, "partner")
    r = [e.rewards["partner"] for e in eps]
    assert r[0] == r[1] == pytest.approx(1.0)                         # s2 = 0.25
    assert r[2] == pytest.approx(math.exp(-0.25 ** 2 / 0.02))         # s2 = 0
    assert r[4] == pytest.approx(math.exp(-(0.1875 - 0.25) ** 2 / 0.02))  # s2 = 3/16
    assert curriculum_value(0.25) == 1.0


def test_adversarial_cooperative_and_registered_rewards():
    eps = eps_with({"g": [0.2, 1.0]})
    apply_partner_reward("adversarial", eps, "partner")
    assert [e.rewards["partner"] for e in eps] == pytest.approx([0.8, 0.0])
    eps = eps_with({"g": [3.0, -1.0]})  # outside [0, 1]: the negative
    apply_partner_reward("adversarial", eps, "partner")
    assert [e.rewards["partner"] for e in eps] == [-3.0, 1.0]
    apply_partner_reward("cooperative", eps, "partner")
    assert [e.rewards["partner"] for e in eps] == [3.0, -1.0]

    @register_reward("test_double")
    def double(episodes, role, agent="agent"):
        return [2 * e.rewards[agent] for e in episodes]

    apply_partner_reward("test_double", eps, "partner")
    assert [e.rewards["partner"] for e in eps] == [6.0, -2.0]
    with pytest.raises(ConfigError, match="unknown partner reward 'nope'"):
        parse_config({"partner": {"reward": "nope"}})
    PARTNER_REWARDS.entries.pop("test_double")


@pytest.fixture()
def two_adapters():
    b = tiny_backend(load_tokenizer("tiny-random"), seed=0)
    b.add_lora("agent", r=4, alpha=8)
    b.add_lora("partner", r=4, alpha=8)
    return b


def rollout(b, n=4, turns=2):
    env_cls = get_env("p4g")
    tasks = env_cls.load_tasks("train")
    refs = {"agent": Binding("agent", ModelRef("agent", b, "agent", True), SP),
            "partner": Binding("partner", ModelRef("partner", b, "partner", True), SP)}
    jobs = [Job(env_cls(tasks[i // 2], random.Random(i), max_turns=turns), Episode(tasks[i // 2].id, str(i // 2), i),
                dict(refs), uid=i) for i in range(n)]
    eps, _ = run_rollouts(jobs, end_on_truncation=False)
    for i, e in enumerate(eps):
        e.rewards = {"agent": float(i % 2), "partner": float((i + 1) % 2)}
    return eps


def snapshot(b):
    return {n: p.detach().clone() for n, p in b.model.named_parameters()}


def test_partner_update_changes_only_the_partner_adapter(two_adapters):
    b = two_adapters
    eps = rollout(b)
    before = snapshot(b)
    learner = Learner(b, "partner", LearnerConfig(lr=1e-2, kl_coef=0.005, temperature=1.0))
    adv, _ = group_advantages(eps, "partner")
    out = learner.update([e.traces["partner"] for e in eps], adv)
    assert out["trained_sequences"] == 4
    changed = [n for n, p in b.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed and all(".partner." in n and "lora_" in n for n in changed)
    assert b.versions["partner"] == 1 and b.versions["agent"] == 0


def test_each_roles_loss_sees_only_its_own_tokens(two_adapters):
    b = two_adapters
    eps = rollout(b)
    tok = b.tokenizer
    learner = Learner(b, "agent", LearnerConfig())
    for e in eps:
        for role, _other in (("agent", "partner"), ("partner", "agent")):
            tr = e.traces[role]
            ids, att, sel, _ = learner._batch([tr])
            trained = ids[sel].tolist()
            own = [t for t, m in zip(tr.token_ids, tr.mask) if m][1:] if tr.mask[0] else \
                [t for t, m in zip(tr.token_ids, tr.mask) if m]
            assert trained == own
            said = [m["content"] for m in e.messages if m["role"] == role]
            text = tok.decode(trained)
            assert all(s in text for s in said if s)
            assert all(tr.turn_model[i] == -1 for i in range(len(tr.mask)) if not tr.mask[i])
            # the models recorded on the trace are the role's own
            assert {m[0] for m in tr.models} == {role}


def test_pool_fifo_eviction_and_shared_base(two_adapters):
    b = two_adapters
    pool = PoolSource(b, "partner", SP, size=3, every=2)
    pool.snapshot(0)
    with torch.no_grad():
        for n, p in b.model.named_parameters():
            if ".partner." in n and "lora_B" in n:
                p.add_(1.0)
    for step in range(1, 9):
        pool.maybe_snapshot(step)
    assert pool.members == ["partner_pool_4", "partner_pool_6", "partner_pool_8"]
    assert set(b.adapter_names()) == {"agent", "partner", *pool.members}
    base_ids = {id(p) for n, p in b.model.named_parameters() if "lora_" not in n}
    assert len(base_ids) == len([n for n, _ in b.model.named_parameters() if "lora_" not in n])
    # a snapshot is a copy of the adapter at that time
    sd = dict(b.model.named_parameters())
    for n, p in sd.items():
        if ".partner_pool_8." in n:
            assert torch.equal(p, sd[n.replace(".partner_pool_8.", ".partner.")])
            assert not p.requires_grad


def test_the_pool_hands_out_frozen_snapshots_never_the_live_adapter(two_adapters):
    """What makes Population Co-Training a population: every draw is a snapshot taken earlier, frozen, on
    its own adapter; after the live adapter trains, no draw plays the live weights (a pool that handed
    out the live adapter would pass the other pool tests and fail this one)."""
    b = two_adapters
    pool = PoolSource(b, "partner", SP, size=3, every=1)
    pool.snapshot(0)
    live = {n: p for n, p in b.model.named_parameters() if ".partner." in n and "lora_" in n}
    snap0 = {n: p.detach().clone() for n, p in live.items()}
    with torch.no_grad():  # the live adapter trains on
        for p in live.values():
            p.add_(0.5)
    pool.snapshot(1)
    with torch.no_grad():
        for p in live.values():
            p.add_(0.5)
    params = dict(b.model.named_parameters())
    for i in range(40):
        bnd = pool.assign(Task("t", "train"), 0, i)
        assert bnd.ref.adapter != "partner" and not bnd.ref.trainable
        member = bnd.ref.adapter
        for n, p in live.items():
            got = params[n.replace(".partner.", f".{member}.")]
            assert not torch.equal(got, p)  # not the live weights
            want = snap0[n] + (0.5 if member == "partner_pool_1" else 0.0)
            assert torch.allclose(got, want)  # the weights as they were when the snapshot was taken
            assert not got.requires_grad


def test_pool_draws_are_uniform(two_adapters):
    b = two_adapters
    pool = PoolSource(b, "partner", SP, size=5, every=1, seed=3)
    for s in range(5):
        pool.snapshot(s)
    n = 5000
    counts = {}
    for i in range(n):
        m = pool.assign(Task("t", "train"), 0, i).id
        counts[m] = counts.get(m, 0) + 1
    assert set(counts) == set(pool.members)
    chi2 = sum((c - n / 5) ** 2 / (n / 5) for c in counts.values())
    assert chi2 < 18.47  # chi-square, 4 degrees of freedom, p = 0.001


def cfg(run_dir, partner, steps=2, save_every=1):
    return parse_config({
        "run": {"dir": str(run_dir), "save_every": save_every, "progress": False},
        "models": {"policy": {"path": "tiny-random", "lora": {"r": 4, "alpha": 8}}},
        "agent": {"model": "policy", "trainable": True, "max_new_tokens": 10},
        "partner": {"model": "policy", "max_new_tokens": 10, **partner},
        "env": {"name": "p4g", "options": {"max_turns": 2, "force_decision": True}},
        "rollout": {"n_tasks": 2, "group_size": 3, "end_on_truncation": False},
        "train": {"steps": steps, "lr": 1e-3}})


def test_cotraining_run_trains_both_with_their_own_rewards(tmp_path):
    train(cfg(tmp_path / "c", {"trainable": True, "reward": "adversarial"}), log=lambda s: None)
    ms = read_metrics(str(tmp_path / "c"))
    m = ms[-1]
    assert m["train/trained_sequences"] == 6 and m["partner/train/trained_sequences"] == 6
    assert m["partner/reward_mean"] == pytest.approx(1 - m["reward_mean"])
    ck = tmp_path / "c" / "checkpoints" / "step_000002"
    assert (ck / "agent" / "agent" / "adapter_model.safetensors").exists()
    assert (ck / "partner" / "partner" / "adapter_model.safetensors").exists()


def test_self_play_one_update_uses_both_roles(tmp_path):
    train(cfg(tmp_path / "s", {"trainable": True, "self_play": True, "reward": "adversarial"}), log=lambda s: None)
    m = read_metrics(str(tmp_path / "s"))[-1]
    assert m["train/trained_sequences"] == 12  # 6 agent traces + 6 partner traces, one update
    assert "partner/train/trained_sequences" not in m
    recs = [json.loads(x) for x in open(tmp_path / "s" / "rollouts" / "step_000001.jsonl")]
    assert all(r["models"]["agent"] == r["models"]["partner"] for r in recs)
    adv = recs[0]["advantage"]
    assert set(adv) == {"agent", "partner"}
    with pytest.raises(ConfigError, match="same temperature"):
        parse_config({"agent": {"trainable": True}, "partner": {"trainable": True, "self_play": True,
                                                                 "temperature": 1.0}})


@pytest.mark.parametrize("self_play", [False, True])
def test_population_pool_is_checkpointed_and_restored_exactly(tmp_path, self_play):
    partner = {"trainable": True, "source": "pool", "pool": {"size": 2, "every": 1}, "reward": "adversarial",
               "self_play": self_play, "group_shared": False}
    straight = tmp_path / "straight"
    train(cfg(straight, partner, steps=4, save_every=2), log=lambda s: None)

    class Stop(Exception):
        pass

    def stop(step):
        if step == 3:
            raise Stop()

    run = tmp_path / "run"
    with pytest.raises(Stop):
        train(cfg(run, partner, steps=4, save_every=2), on_step_end=stop, log=lambda s: None)
    train(cfg(run, partner, steps=4, save_every=2), resume=True, log=lambda s: None)
    a, b = read_metrics(str(run)), read_metrics(str(straight))
    assert [m["step"] for m in a] == [1, 2, 3, 4]
    assert [m["partner/pool_size"] for m in a] == [2, 2, 2, 2]
    for x, y in zip(a, b):
        assert x["reward_mean"] == pytest.approx(y["reward_mean"], abs=1e-6)
    src = "agent" if self_play else "partner"
    st = torch.load(run / "checkpoints" / "step_000004" / "state.pt", weights_only=False)
    assert st["sources"]["partner"]["members"] == [f"{src}_pool_3", f"{src}_pool_4"]
    recs = [json.loads(x) for x in open(run / "rollouts" / "step_000004.jsonl")]
    assert {r["meta"]["partner"] for r in recs} <= {f"{src}_pool_2", f"{src}_pool_3"}


def test_partner_with_its_own_full_model(tmp_path):
    c = cfg(tmp_path / "f", {"trainable": True, "reward": "cooperative"}, steps=1)
    data = c.model_dump(mode="json")
    data["models"]["partner_model"] = {"path": "tiny-random", "finetune": "full"}
    data["partner"]["model"] = "partner_model"
    c = parse_config(data)
    train(c, log=lambda s: None)
    m = read_metrics(str(tmp_path / "f"))[-1]
    assert m["partner/train/trained_sequences"] == 6
    assert (tmp_path / "f" / "checkpoints" / "step_000001" / "partner" / "model.safetensors").exists()


def adapter_b_norm(ckpt_dir, adapter):
    from safetensors.torch import load_file

    sd = load_file(str(ckpt_dir / adapter / adapter / "adapter_model.safetensors"))
    return sum(float(v.abs().sum()) for k, v in sd.items() if "lora_B" in k)


@pytest.mark.parametrize("reward", ["adversarial", "cooperative", "curriculum"])
def test_every_partner_reward_moves_the_partner(tmp_path, reward):
    """The real loop: the partner's LoRA B starts at zero, so it only moves if its advantages carry signal."""
    c = cfg(tmp_path / reward, {"trainable": True, "reward": reward, "temperature": 1.0}, steps=2, save_every=2)
    c.rollout.n_tasks, c.agent.temperature = 4, 1.0
    logs = []
    train(c, log=logs.append)
    assert adapter_b_norm(tmp_path / reward / "checkpoints" / "step_000002", "partner") > 0
    ms = read_metrics(str(tmp_path / reward))
    signal = [m["partner/train/nonzero_adv_frac"] > 0 and m["partner/train/grad_norm"] > 0 for m in ms]
    assert any(signal)
    step = 1 + signal.index(True)
    recs = [json.loads(x) for x in open(tmp_path / reward / "rollouts" / f"step_{step:06d}.jsonl")]
    assert any(abs(r["advantage"]["partner"]) > 0 for r in recs)


def test_curriculum_needs_a_baseline_across_groups():
    """Within a group the curriculum is constant, so group z-scores are all 0; across the step they are not."""
    eps = eps_with({"half": [1.0, 0.0], "same": [1.0, 1.0], "third": [1.0, 0.0, 0.0]})
    apply_partner_reward("curriculum", eps, "partner")
    within, _ = group_advantages(eps, "partner", baseline="group")
    assert all(a == 0 for a in within)
    across, st = group_advantages(eps, "partner", baseline="step")
    r = [e.rewards["partner"] for e in eps]
    mean = sum(r) / len(r)
    sd = (sum((x - mean) ** 2 for x in r) / len(r)) ** 0.5
    assert sd > 0.1  # clearly different values: an ordinary z-score
    assert across == pytest.approx([(x - mean) / sd for x in r], rel=1e-5)
    assert across[0] > 0 > across[2]  # the group kept at variance 0.25 is preferred to the all-success one
    assert st.n_groups == 3 and st.zero_variance == 0
    from scope.partners.rewards import baseline_of

    assert baseline_of("curriculum") == "step" and baseline_of("adversarial") == "group"
    assert baseline_of("curriculum", "group") == "group"


def test_the_step_baseline_does_not_blow_noise_up_to_unit_advantages():
    """16 curriculum values that differ in the fourth decimal (0.04394-0.04413) are centred and divided by
    the floor, not by their tiny std: the advantages stay tiny, where z-scores made them -0.97 to +1.36."""
    from scope.learner import STEP_STD_FLOOR

    vals = [0.04394 + 0.00019 * i / 15 for i in range(16)]
    eps = eps_with({f"g{i}": [1.0] for i in range(16)})
    for e, v in zip(eps, vals):
        e.rewards["partner"] = v
    adv, _ = group_advantages(eps, "partner", baseline="step")
    mean = sum(vals) / len(vals)
    assert adv == pytest.approx([(v - mean) / STEP_STD_FLOOR for v in vals])
    assert max(abs(a) for a in adv) < 0.002


def test_a_partner_that_never_learns_is_reported_loudly(tmp_path):
    """Forcing the curriculum back onto within-group baselines (the old defect): no signal, a warning."""
    c = cfg(tmp_path / "silent", {"trainable": True, "reward": "curriculum", "baseline": "group"}, steps=3,
            save_every=3)
    c.train.no_signal_warn = 2
    logs = []
    train(c, log=logs.append)
    ms = read_metrics(str(tmp_path / "silent"))
    assert [m["partner/train/no_signal_steps"] for m in ms] == [1, 2, 3]
    assert [m["partner/train/nonzero_adv_frac"] for m in ms] == [0.0, 0.0, 0.0]
    warnings = [s for s in logs if s.startswith("WARNING: the partner has learned nothing for 2")]
    assert len(warnings) == 1
    assert adapter_b_norm(tmp_path / "silent" / "checkpoints" / "step_000003", "partner") == 0


def test_cross_play_pairs_one_runs_agent_with_another_runs_partner(tmp_path):
    """Cross-play evaluation: run A's agent against run B's trained partner, loaded as a frozen adapter
    from B's checkpoint (a panel entry's ``adapter``), beside the base as a control."""
    from safetensors.torch import load_file

    from scope.policy import load_policy
    from scope.eval import evaluate, load_panel
    from scope.models.loading import frozen_refs

    for name, seed in (("A", 0), ("B", 7)):
        c = cfg(tmp_path / name, {"trainable": True, "reward": "adversarial"}, steps=1)
        c.run.seed = seed
        train(c, log=lambda s: None)
    ck_a, ck_b = (tmp_path / n / "checkpoints" / "step_000001" for n in ("A", "B"))
    c, backends, agent = load_policy(str(ck_a), None, None, [])
    panel = load_panel({"episodes": 2, "partners": [
        {"id": "B-partner", "model": "policy", "adapter": str(ck_b), "max_new_tokens": 10},
        {"id": "base", "model": "policy", "max_new_tokens": 10}]})
    res = evaluate(agent, panel, frozen_refs(dict(c.models), backends, c.run.seed), c.env, "train")
    assert res["per_partner"]["B-partner"]["n"] == 2 and res["per_partner"]["base"]["n"] == 2
    b = backends["policy"]
    saved = load_file(str(ck_b / "partner" / "partner" / "adapter_model.safetensors"))
    params = dict(b.model.named_parameters())
    assert saved and any("lora_A" in k for k in saved)
    for k, v in saved.items():  # B's partner, exactly, under its cross-play name (frozen)
        p = params[k.replace(".lora_A.weight", ".lora_A.xplay_B_partner.weight")
                    .replace(".lora_B.weight", ".lora_B.xplay_B_partner.weight")]
        assert torch.equal(p.detach(), v.to(p.dtype)) and not p.requires_grad
    recs = [e for e in res["episodes"] if "B-partner" in json.dumps(e)]
    assert recs  # the episodes name who played
    with pytest.raises(Exception, match="adapter_config.json"):
        evaluate(agent, load_panel({"episodes": 1, "partners": [
            {"id": "nothing", "model": "policy", "adapter": str(tmp_path)}]}),
            frozen_refs(dict(c.models), backends, c.run.seed), c.env, "train")


def test_lora_on_the_top_layers_only_trains_them_and_the_pool_copies_them(tmp_path):
    c = cfg(tmp_path / "t", {"trainable": True, "source": "pool", "pool": {"size": 2, "every": 1},
                             "reward": "curriculum", "group_shared": False, "temperature": 1.0}, steps=2)
    c.models["policy"].lora.top_layers = 1
    c.rollout.n_tasks, c.agent.temperature = 4, 1.0
    train(c, log=lambda s: None)
    ck = tmp_path / "t" / "checkpoints" / "step_000002"
    cfg_json = json.loads((ck / "agent" / "agent" / "adapter_config.json").read_text())
    assert cfg_json["layers_to_transform"] == [1]  # the tiny model has 2 layers: only the top one
    from safetensors.torch import load_file

    names = list(load_file(str(ck / "agent" / "agent" / "adapter_model.safetensors")))
    assert names and all(".layers.1." in n for n in names)
    assert adapter_b_norm(ck, "partner") > 0  # the top layer's LoRA weights moved (B starts at zero)
    assert read_metrics(str(tmp_path / "t"))[-1]["partner/train/trained_sequences"] == 12
