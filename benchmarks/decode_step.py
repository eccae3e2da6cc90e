"""Cost of one decoding step and of prefill on the embedded model: where the batching ratio comes from.

Prints ms per decoding step for 1 and 32 rows on a 300-token cache, for the base weights and with a
LoRA adapter active, each with the plain ``F.linear`` and with MKL-packed weights (what the engine
uses while sampling, ``scope/models/packed.py``), and prefill tokens/s for 32 prompts of 204 tokens
in one pass and in the chunks the engine uses. The batching ratio of a dialogue rollout lies between
the decode-only gain (32 x one-row step / 32-row step) and 1 (prefill costs the same per token
batched or not).

    python benchmarks/decode_step.py [--ctx 300] [--steps 12]
"""
from __future__ import annotations

import argparse
import contextlib
import time

import torch

from scope.models.decode import PREFILL_CHUNK_TOKENS, cache_kw, make_cache, n_layers
from scope.models.loading import load_backend
from report import report  # benchmarks/report.py (a script's own directory is on sys.path)


@torch.inference_mode()
def decode_ms(model, rows: int, ctx: int, steps: int) -> float:
    cache = make_cache(n_layers(model), ctx + steps + 1)
    att = torch.ones(rows, ctx + steps + 1, dtype=torch.long)
    att[0, :5] = 0  # one padded row, as in a real batch
    model(input_ids=torch.randint(0, 40000, (rows, ctx)), attention_mask=att[:, :ctx], **{cache_kw(model): cache},
          use_cache=True, logits_to_keep=1)
    tok = torch.randint(0, 40000, (rows, 1))
    t = time.perf_counter()
    for s in range(steps):
        model(input_ids=tok, attention_mask=att[:, :ctx + s + 1], **{cache_kw(model): cache}, use_cache=True,
              logits_to_keep=1)
    return (time.perf_counter() - t) / steps * 1000


@torch.inference_mode()
def prefill_tok_s(model, rows: int, length: int, chunk_rows: int) -> float:
    ids = torch.randint(0, 40000, (rows, length))
    t = time.perf_counter()
    for i in range(0, rows, chunk_rows):
        model(input_ids=ids[i:i + chunk_rows], logits_to_keep=1)
    return rows * length / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=300)
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    torch.set_num_threads(2)
    b = load_backend("smollm2-135m", seed=0)
    b.add_lora("agent")
    for adapter in (None, "agent"):
        for packed in (False, True):
            with b.using(adapter) as m, (b.packed.active(m) if packed else contextlib.nullcontext()):
                decode_ms(m, 2, 32, 2)  # warm-up
                one, many = decode_ms(m, 1, a.ctx, a.steps), decode_ms(m, 32, a.ctx, a.steps)
            print(f"{adapter or 'base':>6} {'packed' if packed else 'plain':>6}: decode step 1 row {one:.1f} ms, "
                  f"32 rows {many:.1f} ms -> decode-only gain at 32: {32 * one / many:.1f}x", flush=True)
    with b.using(None) as m, b.packed.active(m):
        whole = prefill_tok_s(m, 32, 204, 32)
        chunked = prefill_tok_s(m, 32, 204, max(1, PREFILL_CHUNK_TOKENS // 204))
        single = prefill_tok_s(m, 4, 204, 1)
    print(f"prefill 32 x 204 tokens: {whole:.0f} tok/s in one pass, {chunked:.0f} tok/s in the engine's chunks; "
          f"one row at a time {single:.0f} tok/s")
    report("decode_step", prefill_chunked_tok_s=chunked, prefill_single_tok_s=single)


if __name__ == "__main__":
    main()
