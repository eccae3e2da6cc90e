"""The vLLM engine backend's set-up, without vLLM: the server's command line and environment, and the
untied checkpoint a fully fine-tuned tied model is served from (tests/scale/ runs a real engine)."""
import json
import os

import pytest
import torch

from scope.config import parse_config
from scope.models import vllm_backend
from scope.models.loading import load_tokenizer, tiny_backend
from scope.models.vllm_backend import VLLMEngine, attach_engine, tied_embeddings, write_weights


def test_untied_copy_has_the_same_weights_and_its_own_output_layer(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    b = tiny_backend(load_tokenizer("tiny-random"), seed=0)
    assert tied_embeddings(b.model)
    write_weights(b.model, str(tmp_path / "c"), untied=True)
    assert json.load(open(tmp_path / "c" / "config.json"))["tie_word_embeddings"] is False
    sd = load_file(str(tmp_path / "c" / "model.safetensors"))
    assert torch.equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"])
    m = AutoModelForCausalLM.from_pretrained(str(tmp_path / "c"))
    assert not tied_embeddings(m)
    x = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        assert torch.allclose(m(x).logits, b.model(x).logits, atol=1e-5)


def test_engine_command_and_environment(monkeypatch, tmp_path):
    seen = {}
    real_popen = vllm_backend.subprocess.Popen

    def popen(cmd, **kw):  # a harmless process of its own group stands in for the server
        seen.update(cmd=cmd, env=kw["env"])
        return real_popen(["sleep", "60"], start_new_session=True)

    monkeypatch.setattr(vllm_backend.subprocess, "Popen", popen)
    monkeypatch.setattr(VLLMEngine, "wait_ready", lambda self, timeout: None)
    mc = parse_config({"models": {"policy": {"backend": "vllm", "finetune": "full", "vllm": {
        "env": {"CUDA_VISIBLE_DEVICES": "1,2"}, "extra_args": ["--data-parallel-size", "2"]}}, "user": {}},
        "partner": {"model": "user"}}).models["policy"]
    b = attach_engine(tiny_backend(load_tokenizer("tiny-random"), seed=0), mc, str(tmp_path / "ckpt"))
    cmd, env = seen["cmd"], seen["env"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--enable-lora" in cmd
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert cmd[-2:] == ["--tokenizer", str(tmp_path / "ckpt")]  # the untied copy has weights, not a tokenizer
    assert cmd[cmd.index("--model") + 1] == os.path.join(b.sync_dir, "start") and b.untied
    assert os.path.exists(os.path.join(b.sync_dir, "start", "model.safetensors"))
    assert env["CUDA_VISIBLE_DEVICES"] == "1,2" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    proc = b.engine.proc
    b.close()
    assert proc.poll() is not None and not os.path.exists(b.sync_dir)


def test_a_failed_start_leaves_no_sync_dir(monkeypatch, tmp_path):
    made = []
    real = vllm_backend.tempfile.mkdtemp
    monkeypatch.setattr(vllm_backend.tempfile, "mkdtemp", lambda **kw: made.append(real(**kw)) or made[-1])

    def boom(*a, **kw):
        raise vllm_backend.EngineError("the vLLM server exited with code 1 while starting")

    monkeypatch.setattr(vllm_backend, "VLLMEngine", boom)
    mc = parse_config({"models": {"policy": {"backend": "vllm"}}}).models["policy"]
    with pytest.raises(vllm_backend.EngineError):
        attach_engine(tiny_backend(load_tokenizer("tiny-random"), seed=0), mc, str(tmp_path))
    assert made and not any(os.path.exists(d) for d in made)
