"""GRPO: group advantages, the clipped loss, masking, and a learner that climbs."""
import math

import pytest
import torch

from scope.config import parse_config
from scope.learner import Learner, LearnerConfig, group_advantages, token_logprobs
from scope.models.loading import load_tokenizer, tiny_backend
from scope.run import read_metrics
from scope.train import train
from scope.types import Episode, Trace

import helpers  # noqa: F401  (registers the bandit_test env)


def ep(group, r, failed=False):
    e = Episode(task_id=group, group_id=group, copy=0, rewards={} if failed else {"agent": r})
    e.status = "failed" if failed else "done"
    return e


def test_group_zscore_and_counts():
    eps = [ep("a", 1.0), ep("a", 0.0), ep("a", 0.5), ep("a", 0.5),
           ep("b", 1.0), ep("b", 1.0),
           ep("c", 0.0), ep("c", 0.0), ep("c", 0.0, failed=True)]
    adv, st = group_advantages(eps, "agent")
    r = torch.tensor([1.0, 0.0, 0.5, 0.5])
    z = ((r - r.mean()) / r.std(unbiased=False)).tolist()
    assert adv[:4] == pytest.approx(z, abs=1e-4)
    assert adv[4:8] == [0.0] * 4 and adv[8] is None
    assert st.n_groups == 3 and st.zero_variance == 2 and st.all_success == 1 and st.all_failure == 1
    assert st.failed_episodes == 1
    assert st.fractions()["zero_variance_frac"] == pytest.approx(2 / 3)
    assert all(a is None or math.isfinite(a) for a in adv)


def test_single_member_group_gets_zero_not_nan():
    adv, st = group_advantages([ep("a", 0.3)], "agent")
    assert adv == [0.0] and st.zero_variance == 1


@pytest.mark.parametrize("bias,dtype", [(False, torch.float32), (True, torch.float32), (False, torch.bfloat16)])
def test_chunked_output_layer_matches_a_plain_log_softmax(bias, dtype):
    """The chunked log-probs, entropies and gradients (hidden states, weight, bias) equal those of
    log_softmax(head(h).float() / T) with autograd, including chunks that do not divide the rows."""
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(24, 301, bias=bias).to(dtype)
    h0 = torch.randn(37, 24, generator=g).to(dtype)
    tgt = torch.randint(0, 301, (37,), generator=g)
    w_out = torch.randn(37, generator=g)

    def grads(fn):
        head.zero_grad()
        h = h0.clone().requires_grad_(True)
        logp, ent = fn(h)
        (logp * w_out).sum().backward()
        return logp.detach(), ent, h.grad, head.weight.grad.clone(), head.bias.grad.clone() if bias else None

    def plain(h):
        lp = torch.log_softmax(head(h).float() / 0.7, -1)
        return lp.gather(-1, tgt[:, None])[:, 0], -(lp.exp() * lp).sum(-1).detach()

    want = grads(plain)
    got = grads(lambda h: token_logprobs(head, h, tgt, 0.7, chunk=8))
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for a, b in zip(got, want):
        if b is not None:
            assert a.dtype == b.dtype
            torch.testing.assert_close(a.float(), b.float(), **tol)
    head.zero_grad()
    head.weight.requires_grad_(False)  # a frozen head (LoRA): no weight gradient is made
    h = h0.clone().requires_grad_(True)
    token_logprobs(head, h, tgt, 0.7, chunk=8)[0].sum().backward()
    assert head.weight.grad is None and h.grad is not None


def _trace(tok_ids, mask, lps):
    t = Trace(role="agent")
    t.token_ids, t.mask, t.logprobs = list(tok_ids), list(mask), list(lps)
    t.turn_model = [0 if m else -1 for m in mask]
    return t


@pytest.fixture()
def char_backend():
    return tiny_backend(load_tokenizer("tiny-random"), seed=0)


def _rollout_trace(backend, n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, len(backend.tokenizer), (n,), generator=g).tolist()
    mask = [0] * 8 + [1] * 6 + [0] * 4 + [1] * 6
    with torch.no_grad():
        lg = backend.model(torch.tensor([ids])).logits[0].float() / 0.7
    lp = torch.log_softmax(lg, -1)[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    lps = [0.0] + [x if m else 0.0 for x, m in zip(lp, mask[1:])]
    return _trace(ids, mask, lps)


def test_loss_selects_exactly_the_masked_tokens(char_backend):
    tr = _rollout_trace(char_backend)
    learner = Learner(char_backend, None, LearnerConfig(lr=1e-3, kl_coef=0.0))
    ids, att, sel, old = learner._batch([tr])
    assert ids[sel].tolist() == [t for t, m in zip(tr.token_ids, tr.mask) if m]
    assert old.tolist() == pytest.approx([x for x, m in zip(tr.logprobs, tr.mask) if m])


def _grads(backend, trace, adv, kl=0.0):
    learner = Learner(backend, None, LearnerConfig(lr=1e-3, kl_coef=kl))
    learner.optimizer.zero_grad()
    n = sum(trace.mask)
    learner._micro_step([(trace, adv)], n)
    return [p.grad.clone() for p in learner.params if p.grad is not None]


def test_partner_and_env_positions_never_reach_the_loss(char_backend):
    """Garbage in every mask-0 slot (log-probs NaN, ids of the partner changed) leaves the loss alone
    except through the context the agent actually saw; with the context fixed, NaNs there change nothing."""
    tr = _rollout_trace(char_backend)
    g1 = _grads(char_backend, tr, 1.0, kl=0.005)
    poisoned = _trace(tr.token_ids, tr.mask, [float("nan") if not m else x for x, m in zip(tr.logprobs, tr.mask)])
    g2 = _grads(char_backend, poisoned, 1.0, kl=0.005)
    assert all(torch.isfinite(a).all() for a in g2)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))
    # an all-zero mask trains nothing
    empty = _trace(tr.token_ids, [0] * len(tr.mask), [0.0] * len(tr.mask))
    learner = Learner(char_backend, None, LearnerConfig(lr=1e-3))
    assert learner.update([empty], [1.0])["trained_sequences"] == 0


def test_clipped_ratio_has_no_gradient_beyond_the_clip(char_backend):
    tr = _rollout_trace(char_backend)
    # pretend the rollout policy gave these tokens much lower probability: ratio >> 1 + eps_high
    far = _trace(tr.token_ids, tr.mask, [x - 5.0 if m else 0.0 for x, m in zip(tr.logprobs, tr.mask)])
    g = _grads(char_backend, far, +1.0)
    assert all(float(x.abs().max()) == 0.0 for x in g)
    # with a negative advantage the unclipped branch is active and gradients flow
    g = _grads(char_backend, far, -1.0)
    assert any(float(x.abs().max()) > 0.0 for x in g)


def test_update_raises_log_prob_of_positive_advantage_sequences(char_backend):
    trs = [_rollout_trace(char_backend, seed=s) for s in range(4)]
    adv = [1.0, -1.0, 1.0, -1.0]
    learner = Learner(char_backend, None, LearnerConfig(lr=1e-3, kl_coef=0.0, temperature=0.7))

    def seq_lp(t):
        ids, att, sel, _ = learner._batch([t])
        with torch.no_grad():
            return float(learner._token_logprobs(char_backend.model, ids, att, sel)[0].sum())

    before = [seq_lp(t) for t in trs]
    out = learner.update(trs, adv)
    assert out["ratio"] == pytest.approx(1.0, abs=1e-4)  # on-policy: rollout log-probs match
    after = [seq_lp(t) for t in trs]
    for a, b0, b1 in zip(adv, before, after):
        assert (b1 - b0) * a > 0


@pytest.mark.parametrize("finetune,lr", [("lora", 1e-2), ("full", 1e-3)])
def test_learner_climbs_on_a_token_preference(tmp_path, finetune, lr):
    cfg = parse_config({
        "run": {"dir": str(tmp_path / "run"), "save_every": 100, "progress": False, "save_rollouts": False},
        "models": {"policy": {"path": "tiny-random", "finetune": finetune}},
        "agent": {"model": "policy", "trainable": True, "temperature": 1.0, "max_new_tokens": 16},
        "partner": {"model": "policy"},
        "env": {"name": "bandit_test"},
        "rollout": {"n_tasks": 4, "group_size": 8, "end_on_truncation": False},
        "train": {"steps": 12, "lr": lr, "kl_coef": 0.0}})
    train(cfg, log=lambda s: None)
    r = [m["reward_mean"] for m in read_metrics(str(tmp_path / "run"))]
    assert len(r) == 12
    assert sum(r[-3:]) / 3 > sum(r[:3]) / 3 + 0.15, r


def test_grpo_loss_is_the_clipped_surrogate_plus_k3_kl():
    import math

    from scope.learner import grpo_loss

    old = torch.zeros(4)
    logp = torch.tensor([0.0, math.log(1.5), math.log(0.5), math.log(1.1)], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -1.0, 1.0])
    ref = torch.tensor([0.0, 0.0, 0.0, math.log(1.1) + 0.5])
    t = grpo_loss(logp, old, adv, ref, eps_low=0.2, eps_high=0.28, kl_coef=0.1)
    assert t.pg.tolist() == pytest.approx([-1.0, -1.28, 0.8, -1.1])       # clip-higher at 1.28, clip-low at 0.8
    assert t.clipped.tolist() == [False, True, True, False]
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    assert t.kl.tolist() == pytest.approx([0.0, k3(-math.log(1.5)), k3(-math.log(0.5)), k3(0.5)])
    assert t.loss.tolist() == pytest.approx((t.pg + 0.1 * t.kl).tolist())
    t.pg.sum().backward()
    g = logp.grad.tolist()
    assert g[1] == 0.0 and g[2] == 0.0 and g[0] == pytest.approx(-1.0) and g[3] == pytest.approx(-1.1)
    assert grpo_loss(logp.detach(), old, adv, None, 0.2, 0.28, 0.1).kl.abs().sum() == 0


def _group_traces(seed: int, n: int = 4, prompt: int = 48):
    """``n`` traces that share a ``prompt``-token beginning, then differ: generated tokens (trained), a partner's
    reply (not trained), generated tokens again; different lengths."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(10, 2000, (prompt,), generator=g).tolist()
    out = []
    for i in range(n):
        a, b, c = 6 + 3 * i, 5 + i, 4 + 2 * (i % 2)
        rest = torch.randint(10, 2000, (a + b + c,), generator=g).tolist()
        mask = [0] * prompt + [1] * a + [0] * b + [1] * c
        lps = [-float(x % 7) / 3 - 0.5 if m else 0.0 for x, m in zip(head + rest, mask)]
        out.append(_trace(head + rest, mask, lps))
    return out


@pytest.mark.parametrize("kl", [0.0, 0.05])
def test_a_shared_prompt_run_once_gives_the_same_loss_and_gradients(tiny, kl, monkeypatch):
    """The learner runs a micro-batch's common beginning once (``shared_prefix``): log-probs, loss and LoRA
    gradients equal the row-by-row forward's within float rounding, with and without the KL pass."""
    import scope.learner as L

    tiny.add_lora("agent", r=4, alpha=8)
    trs = _group_traces(0)
    assert L.shared_prefix(trs) == 47  # up to one token before the first trained one
    assert L.shared_prefix(trs[:1]) == 0 and L.shared_prefix([trs[0], _group_traces(1)[0]]) == 0
    adv = [1.0, -0.5, 0.25, -1.0]

    def run(min_prefix):
        monkeypatch.setattr(L, "MIN_SHARED_PREFIX", min_prefix)
        with torch.no_grad():
            for n, p in tiny.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.full_like(p, 0.01))  # B != 0: the adapter changes the forward
        learner = Learner(tiny, "agent", LearnerConfig(lr=1e-3, kl_coef=kl))
        learner.optimizer.zero_grad()
        m = learner._micro_step(list(zip(trs, adv)), learner.n_tokens(list(zip(trs, adv))))
        return m, [p.grad.clone() for p in learner.params]

    whole, g_whole = run(10**9)
    shared, g_shared = run(1)
    for k in whole:
        assert shared[k] == pytest.approx(whole[k], rel=1e-4, abs=1e-5), k
    for a, b in zip(g_whole, g_shared):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    assert any(float(g.abs().max()) > 0 for g in g_shared)


def test_micro_batches_keep_a_group_together_and_count_its_prompt_once(tiny):
    """Two groups' traces, shuffled: each micro-batch holds one group's, and its budget counts the shared prompt
    once (the four traces of ~70 tokens fit a budget of 200 only because their 47 shared tokens count once)."""
    import random

    import scope.learner as L

    a, b = _group_traces(0), _group_traces(1)
    items = [(t, 1.0) for t in a + b]
    random.Random(0).shuffle(items)
    learner = Learner(tiny, None, LearnerConfig(lr=1e-3, micro_batch_tokens=200))
    mbs = learner._micro_batches(items)
    groups = [{id(t) for t, _ in mb} for mb in mbs]
    assert sorted(map(len, groups)) == [4, 4]
    assert {frozenset(g) for g in groups} == {frozenset(map(id, a)), frozenset(map(id, b))}
    assert all(L._run_tokens([t for t, _ in mb]) <= 200 for mb in mbs)
    assert max(len(t.token_ids) for t in a) * 4 > 200
