"""The real Gemma 3 270M base (``gemma3-270m``, ``scope[gemma]``), in `make test-gemma` (SCOPE_GEMMA_TESTS=1): its
GGUF is assembled and checked, dequantized once into the cache, loaded with the plain transcript; it answers a
plain question, the engine's sampled log-probs equal a teacher-forced pass (sliding-window layers, a second turn
on its cached key/values), a LoRA update moves its adapter with the learner's log-probs equal to the sampler's,
and a forced-decision readout sums to one."""
import json
import os

import pytest
import torch

import helpers  # noqa: F401  (registers the bandit_test environment)
from scope.types import Readout, SamplingParams

pytestmark = pytest.mark.gemma


@pytest.fixture(scope="module")
def gemma():
    from scope.models.loading import load_backend

    return load_backend("gemma3-270m", seed=0)


def _tf(b, prompt, out, temperature):
    with torch.no_grad():
        lg = b.model(torch.tensor([prompt + out])).logits[0].float() / temperature
    return torch.log_softmax(lg, -1)[len(prompt) - 1:-1].gather(-1, torch.tensor(out)[:, None])[:, 0]


def test_it_is_the_checked_gemma_base_with_a_plain_transcript(gemma):
    from scope.models.loading import EMBEDDED, PLAIN, cache_root

    assert type(gemma.model).__name__ == "Gemma3ForCausalLM" and gemma.model.config.vocab_size == 262144
    assert gemma.window == 512 and gemma.tokenizer.chat_template == PLAIN
    meta = json.load(open(os.path.join(cache_root(), "gemma3-270m", "scope_embedded.json")))
    assert meta["sha256"] == EMBEDDED["gemma3-270m"].sha256 and "Gemma Terms of Use" in meta["licence"]
    tok = gemma.tokenizer
    ids = tok("Q: What is the capital of France?\nA:", add_special_tokens=True)["input_ids"]
    out = gemma.generate([ids], SamplingParams(temperature=0.0, max_new_tokens=8))[0]
    assert "Paris" in tok.decode(out.token_ids)


def test_sampling_and_a_second_turn_are_exact(gemma):
    tok = gemma.tokenizer
    msgs = [{"role": "system", "content": "You are a person chatting online."},
            {"role": "user", "content": "Would you give some of your $2 to Save the Children?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    p = tok(text, add_special_tokens=False)["input_ids"]
    sp = SamplingParams(temperature=0.8, max_new_tokens=12)
    o = gemma.generate([p], sp, sessions=["s"])[0]
    assert torch.allclose(_tf(gemma, p, o.token_ids, 0.8), torch.tensor(o.logprobs), atol=2e-4)
    nxt = p + o.token_ids + ([gemma.eos_ids[0]] if o.finish_reason != "eos" else []) + \
        tok("\nUser:\nWhy not?\nAssistant:\n", add_special_tokens=False)["input_ids"]
    o2 = gemma.generate([nxt], sp, sessions=["s"])[0]
    assert torch.allclose(_tf(gemma, nxt, o2.token_ids, 0.8), torch.tensor(o2.logprobs), atol=2e-4)


def test_a_forced_decision_readout_sums_to_one(gemma):
    def digit(text: str, final: bool):
        return text[:1] if text[:1].isdigit() else ("none" if text or final else None)

    tok = gemma.tokenizer
    msgs = [{"role": "system", "content": "You are a person chatting online. You just earned $2."},
            {"role": "user", "content": "Please give to the children.\n\n[The chat ends now. Decide how much of "
                                        "your $2 to donate, from 0 to 2 dollars.]"}]
    p = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) + "[DONATE $",
            add_special_tokens=False)["input_ids"]
    r = gemma.readout([p], SamplingParams(temperature=0.7, max_new_tokens=1), Readout(outcome=digit, max_tokens=1))[0]
    assert sum(r.dist.values()) == pytest.approx(1.0, abs=1e-5) and len(r.dist) > 1


def test_a_lora_update_moves_the_adapter_from_the_samplers_log_probs(tmp_path):
    from scope.config import parse_config
    from scope.run import read_metrics
    from scope.train import train

    cfg = parse_config({
        "run": {"dir": str(tmp_path / "run"), "save_every": 100, "progress": False, "report_to": []},
        "models": {"policy": {"path": "gemma3-270m", "lora": {"r": 4, "alpha": 8, "top_layers": 4}}},
        "agent": {"model": "policy", "trainable": True, "temperature": 1.0, "max_new_tokens": 6},
        "partner": {"model": "policy", "max_new_tokens": 6},
        "env": {"name": "bandit_test"},
        "rollout": {"n_tasks": 2, "group_size": 4, "end_on_truncation": False},
        "train": {"steps": 1, "lr": 1e-3, "kl_coef": 0.0}})
    train(cfg, log=lambda s: None)
    m = read_metrics(str(tmp_path / "run"))[-1]
    assert abs(m["train/ratio"] - 1.0) < 1e-3 and m["train/grad_norm"] > 0
