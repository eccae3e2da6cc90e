"""The cost of the distributed learner on this CPU: one update of the embedded model (LoRA, KL to the base) on
16 sequences shaped like a P4G agent's (about 240 tokens, 64 generated), in one process and over 2 ranks (gloo,
a FileStore, loopback) with DDP and with FSDP2, timed after a first update (the optimizer's state).

On 2 shared cores no speed-up is expected: two ranks of one thread each do the work of one process of two
threads, plus the collectives. The figure says what the machinery costs here; its worth is on GPUs.

    python benchmarks/parallel_step.py [--model smollm2-135m] [--updates 3]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

from report import report, rss_mb  # benchmarks/report.py


def traces(vocab: int):
    from scope.types import Trace

    rng = random.Random(0)
    out = []
    for i in range(16):
        n = 242 - rng.randrange(0, 40) * (i > 0)
        out.append(Trace(role="agent", token_ids=[rng.randrange(4, min(40000, vocab)) for _ in range(n)],
                         mask=[0] * (n - 64) + [1] * 64, logprobs=[-1.0] * n))
    return out, [1.0 if i % 2 else -1.0 for i in range(16)]


def run(model: str, strategy: str | None, updates: int, threads: int) -> dict:
    import torch

    from scope.learner import Learner, LearnerConfig
    from scope.models.loading import load_backend

    torch.set_num_threads(threads)
    b = load_backend(model)
    b.add_lora("agent")
    lc = LearnerConfig()
    if strategy is None:
        learner = Learner(b, "agent", lc)
        rank = 0
    else:
        from scope.config import parse_config
        from scope.parallel import DistLearner, start

        job = start(parse_config({"parallel": {"agent": {"strategy": strategy}}}), ["agent"])
        learner = DistLearner(job, job.placements["agent"], b, "agent", lc)
        rank = job.rank
    tr, adv = traces(len(b.tokenizer))
    learner.update(tr, adv)  # the optimizer's state
    t = time.perf_counter()
    for _ in range(updates):
        learner.update(tr, adv)
    sec = (time.perf_counter() - t) / updates
    if strategy is not None:
        job.close()
    return {"rank": rank, "seconds": sec, "rss_gb": rss_mb() / 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--child", help="(internal) strategy of this rank")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run(a.model, None if a.child == "none" else a.child, a.updates,
                             threads=2 if a.child == "none" else 1)))
        return
    res = {}
    for strategy in ("none", "ddp", "fsdp"):
        n = 1 if strategy == "none" else 2
        with tempfile.TemporaryDirectory() as d:
            procs = []
            for r in range(n):
                env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), GLOO_SOCKET_IFNAME="lo",
                           SCOPE_DIST_INIT=f"file://{d}/store", OMP_NUM_THREADS="1" if n > 1 else "2")
                procs.append(subprocess.Popen([sys.executable, __file__, "--model", a.model, "--updates",
                                               str(a.updates), "--child", strategy], env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.DEVNULL, text=True))
            outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        res[strategy] = {"seconds": max(o["seconds"] for o in outs), "rss_gb": sum(o["rss_gb"] for o in outs)}
        print(f"{'one process, 2 threads' if n == 1 else f'2 ranks x 1 thread, {strategy}':>28}: update "
              f"{res[strategy]['seconds']:.2f} s, resident {res[strategy]['rss_gb']:.2f} GB (all ranks)", flush=True)
    for s in ("ddp", "fsdp"):
        print(f"{s} over 2 ranks / one process: {res[s]['seconds'] / res['none']['seconds']:.2f}x the time")
    one = res["none"]["seconds"]
    report("parallel_step", one_process_s=one, ddp_ratio=res["ddp"]["seconds"] / one,
           fsdp_ratio=res["fsdp"]["seconds"] / one)


if __name__ == "__main__":
    main()
