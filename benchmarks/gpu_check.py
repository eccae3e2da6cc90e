"""GPU check: a rollout, a LoRA training step and the log-prob consistency check on randomly initialised
models of real shapes (Qwen3-0.6B and Qwen3-4B configurations; no weights travel).

Needs only the project, its venv and a GPU. Prints, per shape: rollout tokens/s, the training step's
time, peak GPU memory, and the largest gap between the sampling log-probs and the learner's
teacher-forced ones (bf16 on the GPU: gaps of a few 1e-2 nats are bf16 rounding).

    python benchmarks/gpu_check.py [--shapes qwen3-0.6b qwen3-4b] [--device cuda] [--rows 16 --new 64]
    python benchmarks/gpu_check.py --shapes tiny --device cpu      (the script's own smoke run, here)

``--fsdp N`` then runs one FSDP2 full fine-tuning update of each shape over N ranks (one GPU each, NCCL; on
the CPU, gloo), scope's own distributed learner (``scope.parallel.DistLearner``): the update's time, each
rank's peak GPU memory and the gradient norm beside the one-process update's on the same batch.

    python benchmarks/gpu_check.py --shapes qwen3-0.6b --fsdp 2
    python benchmarks/gpu_check.py --shapes tiny --device cpu --fsdp 2   (the smoke run, here)
"""
from __future__ import annotations

import argparse
import time

import torch

from report import report  # benchmarks/report.py

SHAPES = {  # the published Qwen3 configurations (hidden, layers, heads, kv heads, MLP, vocab, head dim)
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       intermediate_size=3072, vocab_size=151936, head_dim=128, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     intermediate_size=9728, vocab_size=151936, head_dim=128, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=2048, head_dim=16, tie_word_embeddings=True),
}


def tokenizer(vocab: int):
    """A word-level tokenizer with ``vocab`` entries and ChatML specials (random models need no real one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from scope.models.loading import CHATML

    specials = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
    words = specials + [f"w{i} " for i in range(vocab - len(specials))]
    tk = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>")
    tok.chat_template = CHATML
    return tok


def check(shape: str, device: str, rows: int, new: int, prompt_len: int) -> dict:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from scope.learner import Learner, LearnerConfig
    from scope.models.backend import LocalBackend
    from scope.models.loading import resolve_device, resolve_dtype
    from scope.types import SamplingParams, Trace

    dev = resolve_device(device)
    dtype = resolve_dtype("auto", dev)
    tok = tokenizer(SHAPES[shape]["vocab_size"])
    cfg = Qwen3Config(**SHAPES[shape], max_position_embeddings=4096, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device(dev):
        model = Qwen3ForCausalLM(cfg).to(dtype)
    b = LocalBackend(model, tok, name=shape)
    b.add_lora("agent", r=16, alpha=32)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, cfg.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(rows)]
    sp = SamplingParams(temperature=0.7, max_new_tokens=new)
    b.generate(prompts[:2], SamplingParams(temperature=0.7, max_new_tokens=4), adapter="agent")  # warm-up
    _sync(dev)
    t = time.perf_counter()
    outs = b.generate(prompts, sp, adapter="agent")
    _sync(dev)
    t_roll = time.perf_counter() - t
    n_tok = sum(len(c.token_ids) for c in outs)
    traces = []
    for p, c in zip(prompts, outs):
        tr = Trace(role="agent")
        tr.extend_context(p)
        tr.extend_generated(c.token_ids, c.logprobs, (shape, 0))
        traces.append(tr)
    # log-prob consistency: the learner's teacher-forced log-probs of the sampled tokens
    learner = Learner(b, "agent", LearnerConfig(lr=1e-5, kl_coef=0.0, temperature=0.7))
    gap = 0.0
    with torch.no_grad(), b.using("agent"):
        for tr in traces[:4]:
            ids, att, sel, old = (x.to(dev) for x in learner._batch([tr]))
            lp = learner._token_logprobs(b.model, ids, att, sel)[0]
            gap = max(gap, float((lp - old).abs().max()))
    _sync(dev)
    t = time.perf_counter()
    out = learner.update(traces, [1.0 if i % 2 else -1.0 for i in range(len(traces))])
    _sync(dev)
    t_train = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated(dev) / 2 ** 30 if dev.type == "cuda" else float("nan")
    res = dict(shape=shape, device=str(dev), dtype=str(dtype).replace("torch.", ""), rows=rows,
               rollout_tok_s=n_tok / t_roll, train_step_s=t_train, peak_gpu_gib=peak, max_logprob_gap=gap,
               grad_norm=out.get("grad_norm", float("nan")))
    print(f"{shape:>11} on {res['device']} ({res['dtype']}): rollout {n_tok} tokens in {t_roll:.2f}s "
          f"({res['rollout_tok_s']:.0f} tok/s, {rows} rows), training step {t_train:.2f}s, "
          f"peak GPU memory {peak:.2f} GiB, max |sampling - learner log-prob| {gap:.4f}, "
          f"grad norm {res['grad_norm']:.3g}", flush=True)
    del learner, b, model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def fsdp_child(shape: str, device: str, rows: int, seq: int) -> dict:
    """One rank of the FSDP2 check: a random model of ``shape``, full fine-tuning, one update (after a first)."""
    import os

    from transformers import Qwen3Config, Qwen3ForCausalLM

    from scope.config import parse_config
    from scope.learner import Learner, LearnerConfig
    from scope.models.backend import LocalBackend
    from scope.models.loading import resolve_device, resolve_dtype
    from scope.parallel import DistLearner, local_rank, start
    from scope.types import Trace

    n = int(os.environ.get("WORLD_SIZE", "1"))
    dev = resolve_device(f"cuda:{local_rank()}" if device.startswith("cuda") else device)
    dtype = resolve_dtype("auto", dev)
    tok = tokenizer(SHAPES[shape]["vocab_size"])
    cfg = Qwen3Config(**SHAPES[shape], max_position_embeddings=4096, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device(dev):
        model = Qwen3ForCausalLM(cfg).to(dtype)
    b = LocalBackend(model, tok, name=shape)
    g = torch.Generator().manual_seed(1)
    traces = []
    for _ in range(rows):
        ids = torch.randint(4, cfg.vocab_size, (seq,), generator=g).tolist()
        tr = Trace(role="agent")
        tr.extend_context(ids[: seq // 2])
        tr.extend_generated(ids[seq // 2:], [-2.0] * (seq - seq // 2), (shape, 0))
        traces.append(tr)
    lc = LearnerConfig(lr=1e-6, kl_coef=0.0, micro_batch_tokens=4 * seq)
    if n > 1:
        job = start(parse_config({"parallel": {"agent": {"strategy": "fsdp"}}}), ["agent"])
        learner: Learner = DistLearner(job, job.placements["agent"], b, None, lc)
    else:
        learner = Learner(b, None, lc)
    adv = [1.0 if i % 2 else -1.0 for i in range(rows)]
    first = learner.update(traces, adv)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    _sync(dev)
    t = time.perf_counter()
    learner.update(traces, adv)
    _sync(dev)
    sec = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated(dev) / 2 ** 30 if dev.type == "cuda" else float("nan")
    return {"rank": int(os.environ.get("RANK", "0")), "seconds": sec, "peak_gpu_gib": peak,
            "grad_norm": first.get("grad_norm", float("nan"))}


def fsdp_check(shape: str, device: str, ranks: int, rows: int, seq: int) -> dict:
    """The FSDP2 update over ``ranks`` processes against one process, on the same batch."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    res = {}
    for n in (1, ranks):
        with tempfile.TemporaryDirectory() as d:
            procs = []
            for r in range(n):
                env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                           SCOPE_DIST_INIT=f"file://{d}/store", GLOO_SOCKET_IFNAME="lo")
                procs.append(subprocess.Popen([sys.executable, __file__, "--fsdp-child", shape, "--device", device,
                                               "--rows", str(rows), "--prompt-len", str(seq)], env=env,
                                              stdout=subprocess.PIPE, text=True))
            outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        res[n] = outs
    one, many = res[1][0], res[ranks]
    peaks = ", ".join(f"{o['peak_gpu_gib']:.2f}" for o in many)
    print(f"{shape:>11} FSDP2 full fine-tuning, {rows} x {seq} tokens: one process {one['seconds']:.2f}s "
          f"(peak {one['peak_gpu_gib']:.2f} GiB, grad norm {one['grad_norm']:.4g}); {ranks} ranks "
          f"{max(o['seconds'] for o in many):.2f}s (peak per rank "
          f"{peaks} GiB, grad norm {many[0]['grad_norm']:.4g})",
          flush=True)
    return {"fsdp_one_s": one["seconds"], "fsdp_ranks_s": max(o["seconds"] for o in many),
            "fsdp_peak_gib": max(o["peak_gpu_gib"] for o in many), "fsdp_grad_norm_gap":
            abs(one["grad_norm"] - many[0]["grad_norm"]) / max(abs(one["grad_norm"]), 1e-12)}


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "qwen3-4b"], choices=list(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--fsdp", type=int, default=0, help="also one FSDP2 update over this many ranks (GPUs)")
    ap.add_argument("--fsdp-child", help="(internal) one rank of the FSDP2 check, this shape")
    a = ap.parse_args()
    if a.fsdp_child:
        import json

        print(json.dumps(fsdp_child(a.fsdp_child, a.device, a.rows, a.prompt_len)))
        return
    figures = {}
    for s in a.shapes:
        r = check(s, a.device, a.rows, a.new, a.prompt_len)
        figures.update({f"{s}_{k}": v for k, v in r.items() if isinstance(v, float)})
        if a.fsdp > 1:
            figures.update({f"{s}_{k}": v for k, v in fsdp_check(s, a.device, a.fsdp, a.rows, a.prompt_len).items()})
    report("gpu_check", **figures)


if __name__ == "__main__":
    main()
