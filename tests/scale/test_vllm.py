"""The vLLM engine backend against a real vLLM (CPU build) server on 127.0.0.1, on the embedded model.

One engine serves the whole module (it takes a few minutes to start here). Runs in `make test-scale`
(SCOPE_SCALE_TESTS=1, in .venv-scale, which has vLLM and Ray).
"""
import os
import signal
import threading

import pytest
import torch

pytest.importorskip("vllm")

from scope.config import parse_config  # noqa: E402
from scope.models.loading import load_backend, resolve_model_path
from scope.models.vllm_backend import EngineBackend, EngineError, VLLMEngine  # noqa: E402
from scope.rollout import Job, run_rollouts  # noqa: E402
from scope.run import read_metrics  # noqa: E402
from scope.train import train  # noqa: E402
from scope.types import SamplingParams  # noqa: E402

TOL = 2e-3  # nats: engine sampling log-probs vs the learner's teacher-forced ones (fp32 both; seen ~3e-5)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = VLLMEngine(resolve_model_path("smollm2-135m"), max_loras=4, max_lora_rank=16, max_model_len=2048,
                   extra_args=["--block-size", "32"], log_path=str(tmp_path_factory.mktemp("vllm") / "server.log"))
    yield e
    e.close()


@pytest.fixture(scope="module")
def backend(engine):
    b = load_backend("smollm2-135m")
    b.add_lora("a")
    b.add_lora("b")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # adapters that differ from the base and from each other
        for n, p in b.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return EngineBackend(b, engine)


def prompt(b, text):
    x = b.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(x["input_ids"] if hasattr(x, "keys") else x)


def teacher_forced(b, p, ids, adapter, temperature):
    with torch.no_grad(), b.using(adapter):
        lg = b.model(torch.tensor([p + ids])).logits[0, len(p) - 1:-1].float() / temperature
    return torch.log_softmax(lg, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]


def test_base_and_two_adapters_at_once_token_exact(backend):
    prompts = [prompt(backend, "Tell me about dogs."), prompt(backend, "What is 2+2?")]
    sp = SamplingParams(temperature=0.7, max_new_tokens=20)
    res = {}

    def run(ad):
        res[ad] = backend.generate(prompts, sp, adapter=ad)

    ts = [threading.Thread(target=run, args=(ad,)) for ad in (None, "a", "b")]  # in flight together
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for ad, outs in res.items():
        for p, c in zip(prompts, outs):
            assert not isinstance(c, BaseException), c
            assert c.token_ids and len(c.logprobs) == len(c.token_ids)
            assert c.finish_reason in ("eos", "length")
            assert (c.finish_reason == "eos") == (c.token_ids[-1] in backend.eos_ids)
            lp = teacher_forced(backend, p, c.token_ids, ad, 0.7)
            assert float((lp - torch.tensor(c.logprobs)).abs().max()) < TOL, ad
    assert backend.served_name("a") == "a@v0" and backend.served_name(None) == "base"


def test_greedy_tokens_equal_the_local_engine(backend):
    prompts = [prompt(backend, "Name three colours."), prompt(backend, "Write a haiku about rain.")]
    g = SamplingParams(temperature=0.0, max_new_tokens=24)
    for ad in (None, "a"):
        local = backend.local.generate(prompts, g, adapter=ad)
        eng = backend.generate(prompts, g, adapter=ad)
        assert [c.token_ids for c in local] == [c.token_ids for c in eng], ad


def test_adapter_version_swap_unloads_the_old_version(backend):
    p = [prompt(backend, "Say something kind.")]
    sp = SamplingParams(temperature=0.7, max_new_tokens=12)
    backend.generate(p, sp, adapter="b")
    before = dict(backend.stats)
    with torch.no_grad():  # an "update" of b: new weights, new version
        for n, w in backend.local.model.named_parameters():
            if ".b." in n and "lora_B" in n:
                w.mul_(-1.5)
    backend.local.versions["b"] += 1
    c = backend.generate(p, sp, adapter="b")[0]
    assert backend.loaded["b"] == [f"b@v{backend.local.versions['b']}"]
    assert backend.stats["syncs"] == before["syncs"] + 1 and backend.stats["unloaded"] >= before["unloaded"] + 1
    lp = teacher_forced(backend, p[0], c.token_ids, "b", 0.7)  # sampled from the new weights
    assert float((lp - torch.tensor(c.logprobs)).abs().max()) < TOL
    models = backend.engine.get("/v1/models")
    names = {m["id"] for m in models["data"]}
    assert f"b@v{backend.local.versions['b']}" in names and "b@v0" not in names


def test_training_run_through_the_engine(engine, tmp_path):
    """Two LoRA training steps with generation on the engine: the agent's adapter is synced each step."""
    cfg = parse_config({
        "run": {"dir": str(tmp_path / "run"), "save_every": 1000, "progress": False},
        "models": {"policy": {"backend": "vllm", "vllm": {"base_url": engine.base_url}}},
        "agent": {"model": "policy", "trainable": True, "max_new_tokens": 16},
        "partner": {"model": "policy", "max_new_tokens": 16},
        "env": {"name": "p4g", "options": {"max_turns": 2, "force_decision": True}},
        "rollout": {"n_tasks": 2, "group_size": 2, "end_on_truncation": False},
        "train": {"steps": 2, "lr": 1e-4}})
    train(cfg, log=lambda s: None)
    ms = read_metrics(str(tmp_path / "run"))
    assert [m["step"] for m in ms] == [1, 2]
    assert all(m["failed_episodes"] == 0 for m in ms)
    assert ms[-1]["engine/policy/syncs"] >= 2  # v0 at step 1, v1 at step 2
    assert ms[0]["train/trained_sequences"] > 0


def test_engine_killed_mid_step_fails_episodes_not_the_step(tmp_path):
    from scope.envs.base import get_env
    from scope.models.backend import ModelRef
    from scope.types import Episode
    import random

    e = VLLMEngine(resolve_model_path("smollm2-135m"), max_loras=2, max_model_len=1024,
                   log_path=str(tmp_path / "server.log"))
    b = EngineBackend(load_backend("smollm2-135m"), e)
    env_cls = get_env("p4g")
    tasks = env_cls.load_tasks("train")[:2]
    ref = ModelRef(id="policy:base", backend=b)
    sp = SamplingParams(temperature=0.7, max_new_tokens=8)
    jobs = [Job(env=env_cls(t, random.Random(i), max_turns=2), episode=Episode(task_id=t.id, group_id=str(i), copy=0),
                bindings={"agent": ref, "partner": ref}, uid=i) for i, t in enumerate(tasks)]
    os.killpg(e.proc.pid, signal.SIGKILL)
    e.proc.wait()
    eps, _ = run_rollouts(jobs, sampling={"agent": sp, "partner": sp})
    assert all(ep.status == "failed" for ep in eps)
    assert all("vLLM" in (ep.error or "") for ep in eps)
    with pytest.raises(EngineError):
        e.post("/v1/completions", {"model": "base", "prompt": [1, 2], "max_tokens": 1}, timeout=5)


def test_full_finetuning_is_synced_to_the_engine(tmp_path):
    """A fully fine-tuned model: its moved weights are reloaded in place on the engine, so the engine's
    greedy tokens follow the local weights and its sampling log-probs are the new model's (the embedded
    model ties its output layer to the embeddings: the engine serves an untied copy); then a 2-step full
    fine-tuning run, which starts an engine of its own."""
    from scope.models.vllm_backend import attach_engine

    def model_cfg(**vllm):
        return parse_config({"models": {"policy": {"backend": "vllm", "finetune": "full", "vllm": {
            "max_loras": 1, "max_model_len": 1024, "extra_args": ["--block-size", "32"], **vllm}}, "user": {}},
            "partner": {"model": "user"}}).models["policy"]

    b = attach_engine(load_backend("smollm2-135m"), model_cfg(), resolve_model_path("smollm2-135m"))
    try:
        assert b.untied
        with pytest.raises(ValueError, match="tied embeddings"):  # a server of one's own cannot be trusted to
            attach_engine(load_backend("smollm2-135m"), model_cfg(base_url=b.engine.base_url), None)  # be untied
        prompts = [prompt(b, "Name three colours."), prompt(b, "Write a haiku about rain."),
                   prompt(b, "What is the capital of France?")]
        g = SamplingParams(temperature=0.0, max_new_tokens=16)
        before = [c.token_ids for c in b.generate(prompts, g)]
        assert before == [c.token_ids for c in b.local.generate(prompts, g)]
        assert b.stats["syncs"] == 1 and b.synced_full == 0  # once at first use
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():  # an "update" of the whole model, the (tied) embeddings included
            for n, w in b.local.model.named_parameters():
                if "mlp" in n or "embed" in n:
                    w.add_(torch.randn(w.shape, generator=gen) * 0.1 * w.std())
        b.local.versions[None] = 1
        after = [c.token_ids for c in b.generate(prompts, g)]
        assert b.stats["syncs"] == 2 and b.synced_full == 1
        assert after == [c.token_ids for c in b.local.generate(prompts, g)]
        assert after != before  # the engine samples from the new weights, not the ones it started with
        assert sorted(os.listdir(b.sync_dir)) == ["full@v1"]  # older copies are gone
        for p, c in zip(prompts, b.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=16))):
            lp = teacher_forced(b, p, c.token_ids, None, 0.7)
            assert float((lp - torch.tensor(c.logprobs)).abs().max()) < TOL
    finally:
        b.close()
    assert not os.path.exists(b.sync_dir)

    cfg = parse_config({
        "run": {"dir": str(tmp_path / "run"), "save_every": 1000, "progress": False},
        "models": {"policy": {"backend": "vllm", "finetune": "full",
                              "vllm": {"max_model_len": 1024, "extra_args": ["--block-size", "32"]}}},
        "agent": {"model": "policy", "trainable": True, "max_new_tokens": 12},
        "partner": {"model": "policy", "max_new_tokens": 12},  # frozen: a second engine, the original weights
        "env": {"name": "p4g", "options": {"max_turns": 2, "force_decision": True}},
        "rollout": {"n_tasks": 2, "group_size": 2, "end_on_truncation": False},
        "train": {"steps": 2, "lr": 1e-5}})
    train(cfg, log=lambda s: None)
    ms = read_metrics(str(tmp_path / "run"))
    assert [m["step"] for m in ms] == [1, 2] and all(m["failed_episodes"] == 0 for m in ms)
    assert ms[-1]["engine/policy/syncs"] >= 2  # v0 at step 1 (first use), v1 at step 2


@pytest.mark.parametrize("stale", ["drop", "finish"])
def test_asynchronous_rollouts_on_the_engine(engine, tmp_path, stale):
    """rollout.max_staleness: 1 with the engine fed from a thread: adapters are published between updates, each
    batch plays the versions it was submitted with (drop) or the newest published (finish); 4 steps, no failure."""
    cfg = parse_config({
        "run": {"dir": str(tmp_path / "run"), "save_every": 1000, "progress": False},
        "models": {"policy": {"backend": "vllm", "vllm": {"base_url": engine.base_url}}},
        "agent": {"model": "policy", "trainable": True, "max_new_tokens": 16},
        "partner": {"model": "policy", "max_new_tokens": 16},
        "env": {"name": "p4g", "options": {"max_turns": 2, "force_decision": True}},
        "rollout": {"n_tasks": 2, "group_size": 2, "end_on_truncation": False, "max_staleness": 1, "stale": stale},
        "train": {"steps": 4, "lr": 1e-4, "tis_cap": 2.0}})
    train(cfg, log=lambda s: None)
    ms = read_metrics(str(tmp_path / "run"))
    assert all(m["failed_episodes"] == 0 for m in ms)
    assert [m["async/staleness_max"] for m in ms] == [0.0, 1.0, 1.0, 1.0]
    assert all(0 <= m["train/tis_truncated"] <= 1 and m["train/mismatch_kl"] >= 0 for m in ms)
