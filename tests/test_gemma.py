"""The second family on a tiny randomly initialised Gemma 3 (``tiny-gemma3``: sliding-window layers of 8 tokens
around a global one, grouped-query attention, the plain transcript of a base model): sampling with key/value
reuse is exact past the window, the plain transcript is token in / token out, LoRA training moves the weights,
the decision readout and the learner's log-probs agree with a teacher-forced pass, and `scope serve`, `scope
eval` and `scope sim fit` run on it. (The real Gemma 3 270M: tests/test_gemma_real.py, `make test-gemma`.)"""
import json
import random

import pytest
import torch

from helpers import ScriptedRef
from scope.models.loading import PLAIN, load_backend, load_tokenizer
from scope.types import Episode, Readout, SamplingParams


@pytest.fixture()
def g():
    return load_backend("tiny-gemma3", seed=1)


def enc(b, msgs, gen=True):
    tok = b.tokenizer
    return tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen),
               add_special_tokens=False)["input_ids"]


def teacher_forced(b, prompt, out, temperature):
    with torch.no_grad():
        lg = b.model(torch.tensor([prompt + out])).logits[0].float() / temperature
    return torch.log_softmax(lg, -1)[len(prompt) - 1:-1].gather(-1, torch.tensor(out)[:, None])[:, 0]


def test_the_tiny_gemma_is_a_gemma3_with_sliding_window_layers(g):
    assert type(g.model).__name__ == "Gemma3ForCausalLM" and g.window == 8
    assert "sliding_attention" in g.model.config.layer_types and "full_attention" in g.model.config.layer_types
    assert g.tokenizer.chat_template == PLAIN


def test_sampling_with_key_value_reuse_is_exact_past_the_window(g):
    """Batched sampling, a second turn on each session's cached key/values, and a common system prompt: every
    log-prob equals a teacher-forced pass, on prompts many times longer than the 8-token window (a prefix shared
    as one block would be attended whole by the sliding layers: such a model never shares one)."""
    g.min_shared_prefix = 4
    system = {"role": "system", "content": "one long system prompt that every row starts with"}
    prompts = [enc(g, [system, {"role": "user", "content": u}]) for u in ["first persona", "second", "x"]]
    sp = SamplingParams(temperature=0.8, max_new_tokens=10)
    outs = g.generate(prompts, sp, sessions=["a", "b", "c"])
    for p, o in zip(prompts, outs):
        assert len(p) > 8 * g.window
        assert torch.allclose(teacher_forced(g, p, o.token_ids, 0.8), torch.tensor(o.logprobs), atol=1e-4)
    assert all(g.kv_store[k].shared is None for k in "abc")
    nxt = [p + o.token_ids + ([g.eos_ids[0]] if o.finish_reason != "eos" else [])
           + enc(g, [{"role": "user", "content": f"turn two {k}"}], gen=True)[1:]  # (without a second bos)
           for k, p, o in zip("abc", prompts, outs)]
    outs2 = g.generate(nxt, sp, sessions=["a", "b", "c"])
    for p, o in zip(nxt, outs2):
        assert torch.allclose(teacher_forced(g, p, o.token_ids, 0.8), torch.tensor(o.logprobs), atol=1e-4)


def test_the_plain_transcript_is_token_in_token_out(g):
    """A P4G dialogue on the plain transcript: each role's trace is exactly the transcript of its whole view
    (turn after turn extends the text, replies end at the end-of-text token), and the masks hold only the
    role's own tokens."""
    from scope.envs.base import get_env
    from scope.rollout import Job, run_rollouts

    tok = g.tokenizer
    env_cls = get_env("p4g")
    task = env_cls.load_tasks("train")[0]
    env = env_cls(task, random.Random(0), max_turns=2)
    agent = ScriptedRef(tok, ["Hello! Would you give?", "Even $1 helps."], "agent")
    partner = ScriptedRef(tok, ["Who are they?", "Alright. [DONATE $1]"], "partner")
    job = Job(env=env, episode=Episode(task.id, "g", 0), bindings={"agent": agent, "partner": partner})
    eps, _ = run_rollouts([job], {"agent": SamplingParams(max_new_tokens=64),
                                  "partner": SamplingParams(max_new_tokens=64)}, end_on_truncation=False)
    ep = eps[0]
    assert ep.status == "done" and ep.rewards["agent"] == 0.5
    for role in ("agent", "partner"):
        tr = ep.traces[role]
        text = tok.apply_chat_template(env.views[role], tokenize=False)
        assert tr.token_ids == tok(text, add_special_tokens=False)["input_ids"], role
        assert "User:\n" in text and "Assistant:\n" in text
        said = tok.decode([t for t, m in zip(tr.token_ids, tr.mask) if m])
        mine = [m["content"] for m in env.views[role] if m["role"] == "assistant"]
        assert said == "".join(m + tok.eos_token for m in mine)


def test_a_chat_model_without_a_template_names_the_key_to_set():
    from scope.models.loading import apply_template, char_tokenizer

    tok = char_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="models.<name>.template: plain"):
        apply_template(tok, "auto", "some/checkpoint")
    assert apply_template(tok, "plain", "some/checkpoint").chat_template == PLAIN
    assert load_tokenizer("tiny-gemma3", template="chat").chat_template != PLAIN  # its char tokenizer's ChatML


def test_the_readout_is_exact_on_the_gemma_layers(g):
    """A readout (no shared lower layers: that split is Llama's) gives a distribution that sums to one and the
    same distribution one prompt at a time, and its draw carries a teacher-forced pass's log-probs."""
    def first_char(text: str, final: bool):
        return text[:1] if text else ("none" if final else None)

    ro = Readout(outcome=first_char, max_tokens=2)
    sp = SamplingParams(temperature=0.9, max_new_tokens=2)
    ps = [enc(g, [{"role": "user", "content": f"question {i} with a few words"}]) for i in range(3)]
    together = g.readout(ps, sp, ro)
    for p, r in zip(ps, together):
        assert sum(r.dist.values()) == pytest.approx(1.0, abs=1e-6)
        alone = g.readout([p], sp, ro)[0]
        assert all(r.dist[k] == pytest.approx(alone.dist[k], abs=1e-5) for k in r.dist)
        c = r.completion
        assert c.logprobs == pytest.approx(teacher_forced(g, p, c.token_ids, 0.9).tolist(), abs=1e-4)


def test_the_learner_computes_chunked_log_probs_and_lora_moves_the_weights(tmp_path, monkeypatch):
    """A short GRPO run on the tiny Gemma with a LoRA adapter: the learner's log-probs go through the chunked
    output layer (no whole vocabulary-wide logits for a micro-batch), equal the sampler's before the update, and
    the update moves the adapter."""
    from scope import learner as L
    from scope.config import parse_config
    from scope.run import read_metrics
    from scope.train import train

    calls = []
    real = L._ChunkedLogProbs.apply
    monkeypatch.setattr(L._ChunkedLogProbs, "apply", lambda *a: calls.append(a[0].shape) or real(*a))
    cfg = parse_config({
        "run": {"dir": str(tmp_path / "run"), "save_every": 100, "progress": False, "report_to": []},
        "models": {"policy": {"path": "tiny-gemma3", "lora": {"r": 4, "alpha": 8}}},
        "agent": {"model": "policy", "trainable": True, "temperature": 1.0, "max_new_tokens": 8},
        "partner": {"model": "policy", "max_new_tokens": 8},
        "env": {"name": "bandit_test"},
        "rollout": {"n_tasks": 2, "group_size": 4, "end_on_truncation": False},
        "train": {"steps": 2, "lr": 1e-2, "kl_coef": 0.0}})
    train(cfg, log=lambda s: None)
    ms = read_metrics(str(tmp_path / "run"))
    assert len(ms) == 2 and calls
    assert abs(ms[0]["train/ratio"] - 1.0) < 1e-3  # one minibatch: the learner's log-probs are the sampler's
    assert ms[-1]["train/grad_norm"] > 0
    from safetensors.torch import load_file

    w = load_file(str(next((tmp_path / "run" / "checkpoints").rglob("adapter_model.safetensors"))))
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in w.items())  # B starts at zero: it moved


def test_serve_eval_and_fit_run_on_the_gemma_family(tmp_path):
    from scope.models.openai_backend import OpenAIRef
    from scope.models.server import serve_in_thread
    from scope.types import Completion

    srv, url = serve_in_thread(load_backend("tiny-gemma3", seed=0))
    try:
        ref = OpenAIRef("g", base_url=url, model="tiny-gemma3", api_key_env=None)
        out = ref.chat_generate([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=4))
        assert isinstance(out[0], Completion)
    finally:
        srv.shutdown()
    from scope.cli import main

    panel = tmp_path / "panel.yaml"
    panel.write_text("episodes: 2\nmodels: {gem: {path: tiny-gemma3}}\npartners:\n"
                     "  - {id: llama, seen: true, model: policy, max_new_tokens: 4}\n"
                     "  - {id: gemma, seen: false, model: gem, max_new_tokens: 4}\n")
    assert main(["eval", "--policy", "base", "--model", "tiny-random", "--panel", str(panel),
                 "--out", str(tmp_path / "ev")]) == 0
    ev = json.load(open(tmp_path / "ev" / "eval.json"))
    per = ev["per_partner"]
    assert per["gemma"]["family"] == "tiny-gemma3" and per["llama"]["family"] == "tiny-random"
    assert not per["gemma"]["training_family"] and "unseen_other_family_mean" in ev


def test_a_simulator_is_fitted_to_people_on_the_gemma_family(tmp_path):
    """`scope sim fit` on the tiny Gemma: the plain transcript extends each turn (the fit's check), the loss falls,
    and the adapter plays as a panel member's."""
    from conftest import shared_path
    from scope.sim.fit import FitConfig, fit

    p4g = shared_path("data", "p4g")
    meta = fit(FitConfig(model="tiny-gemma3", data_dir=p4g, out=str(tmp_path / "fit"), max_dialogues=6,
                         max_tokens=768, batch_tokens=1536, lr=1e-2, epochs=2.0, warmup_steps=2),
               log=lambda s: None, progress=False)
    assert meta["finished"] and meta["losses"][-1] < meta["losses"][0]
    from scope.models.backend import ModelRef
    from scope.models.loading import load_frozen_adapter

    b = load_backend("tiny-gemma3", seed=0)
    ref = load_frozen_adapter(ModelRef("g:base", b), str(tmp_path / "fit" / "adapter"), "fitted")
    out = ref.generate([enc(b, [{"role": "user", "content": "hello"}])], SamplingParams(max_new_tokens=4))
    assert len(out[0].token_ids) > 0


def test_a_run_warns_when_every_unseen_member_is_of_its_training_family(tmp_path):
    """One line at the start of a run whose panel's unseen members are all of a training simulator's family, and
    the mark in its evaluation table; none once the panel has a member of another family."""
    from scope.config import parse_config
    from scope.train import train

    def run(name, unseen_model):
        panel = tmp_path / f"{name}.yaml"
        panel.write_text("episodes: 1\nmodels: {gem: {path: tiny-gemma3}}\npartners:\n"
                         "  - {id: seen, seen: true, model: policy, max_new_tokens: 4}\n"
                         f"  - {{id: other, seen: false, model: {unseen_model}, max_new_tokens: 4}}\n")
        logs: list[str] = []
        train(parse_config({
            "run": {"dir": str(tmp_path / name), "progress": False, "report_to": []},
            "models": {"policy": {"path": "tiny-random"}},
            "agent": {"model": "policy", "trainable": True, "max_new_tokens": 4},
            "partner": {"model": "policy", "max_new_tokens": 4},
            "env": {"name": "p4g", "options": {"max_turns": 1, "force_decision": True}},
            "train": {"steps": 0}, "eval": {"panel": str(panel)}}), log=logs.append)
        return logs, open(tmp_path / name / "eval" / "step_000000" / "eval.md").read()

    logs, md = run("same", "policy")
    assert [x for x in logs if x.startswith("WARNING: every unseen member")] and "| other†‡ |" in md
    logs, md = run("cross", "gem")
    assert not any("WARNING" in x for x in logs) and "| other |" in md and "| tiny-gemma3 |" in md
