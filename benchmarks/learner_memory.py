"""Memory and time of one learner update against `train.micro_batch_tokens`.

The update of the embedded model (LoRA, KL to the base) on 16 sequences shaped like a P4G agent's
(about 240 tokens, 64 of them generated), once per micro-batch size, each size in its own process.
A thread samples the resident set every 3 ms; the transient is the peak during the second update
minus the resident set just before it (the first one allocates the optimizer state). The transient
is what every learner update adds on top of what a run holds, so it sets a training run's peak.

    python benchmarks/learner_memory.py [--sizes 4096,1024]
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time

from report import report, rss_mb, track_peak  # benchmarks/report.py (a script's own directory is on sys.path)


def child(size: int) -> dict:
    import torch

    from scope.learner import Learner, LearnerConfig
    from scope.memory import release_free_memory
    from scope.models.loading import load_backend
    from scope.types import Trace

    torch.set_num_threads(2)
    peak = track_peak()
    b = load_backend("smollm2-135m")
    b.add_lora("agent")
    rng = random.Random(0)
    traces = []
    for i in range(16):
        n = 242 - rng.randrange(0, 40) * (i > 0)
        traces.append(Trace(role="agent", token_ids=[rng.randrange(100, 40000) for _ in range(n)],
                            mask=[0] * (n - 64) + [1] * 64, logprobs=[-1.0] * n))
    learner = Learner(b, "agent", LearnerConfig(micro_batch_tokens=size))
    out = {}
    for _rep in range(2):
        release_free_memory()
        before = peak[0] = rss_mb()
        t = time.perf_counter()
        learner.update(traces, [1.0 if i % 2 else -1.0 for i in range(16)])
        out = {"seconds": time.perf_counter() - t, "transient_mb": peak[0] - before, "peak_mb": peak[0],
               "micro_batches": len(learner._micro_batches([(t, 1.0) for t in traces]))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,1024", help="comma-separated micro_batch_tokens values")
    ap.add_argument("--child", type=int)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child)))
        return
    from scope.config import TrainConfig

    default = TrainConfig.model_fields["micro_batch_tokens"].default
    res = {}
    for size in (int(s) for s in a.sizes.split(",")):
        r = subprocess.run([sys.executable, __file__, "--child", str(size)], capture_output=True, text=True,
                           check=True)
        res[size] = json.loads(r.stdout.strip().splitlines()[-1])
        m = res[size]
        print(f"micro_batch_tokens {size:>5}{' (default)' if size == default else '':>10}: "
              f"{m['micro_batches']} micro-batches, update {m['seconds']:.1f} s, "
              f"transient {m['transient_mb'] / 1024:.2f} GB (peak {m['peak_mb'] / 1024:.2f} GB)", flush=True)
    if default in res:
        report("learner_memory", transient_gb=res[default]["transient_mb"] / 1024,
               update_s=res[default]["seconds"])
        if 4096 in res and default != 4096:
            print(f"default vs 4096: transient {res[default]['transient_mb'] / res[4096]['transient_mb']:.2f}x, "
                  f"update time {res[default]['seconds'] / res[4096]['seconds']:.2f}x")


if __name__ == "__main__":
    main()
