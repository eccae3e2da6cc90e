"""One rank of a distributed test (tests/dist/test_parallel.py starts N of these with RANK, WORLD_SIZE and a
FileStore in SCOPE_DIST_INIT). ``python tests/dist_worker.py SPEC.json``:

- ``{"kind": "train", "config": {...}, "resume": false}``: ``scope.train.train`` on this rank;
- ``{"kind": "update", "finetune": "lora"|"full", "strategy": "ddp"|"fsdp", "out": DIR}``: one learner update on
  the shared synthetic batch (``batch()``), rank 0 writing the trained weights and metrics to ``OUT/rank0.pt``
  (optional: ``"shared"``, a prompt every trace begins with, and ``"micro_batch_tokens"``).
"""
import json
import os
import sys

import torch


def batch(tokenizer_len: int, n: int = 6, seed: int = 3, shared: int = 0):
    """Traces of different lengths (so that the shares differ by rank), with advantages; with ``shared``, every
    trace begins with the same ``shared`` context tokens (a group's prompt, which the learner runs once)."""
    from scope.types import Trace

    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(5, min(tokenizer_len, 2000), (shared,), generator=g).tolist()
    traces, advs = [], []
    for i in range(n):
        length = 10 + 4 * i
        ids = torch.randint(5, min(tokenizer_len, 2000), (length,), generator=g).tolist()
        t = Trace(role="agent")
        t.extend_context(prompt + ids[:6])
        t.extend_generated(ids[6:], (-1.0 - torch.rand(length - 6, generator=g)).tolist(), ("m", 0))
        traces.append(t)
        advs.append(float(torch.randn(1, generator=g)))
    return traces, advs


def learner_parts(finetune: str, micro_batch_tokens: int = 40):
    from scope.learner import LearnerConfig
    from scope.models.loading import load_tokenizer, tiny_backend

    b = tiny_backend(load_tokenizer("smollm2-135m"), seed=0)
    adapter = None
    if finetune == "lora":
        torch.manual_seed(1)
        b.add_lora("agent", r=4, alpha=8)
        adapter = "agent"
    cfg = LearnerConfig(lr=1e-2, kl_coef=0.05, micro_batch_tokens=micro_batch_tokens, temperature=1.0)
    return b, adapter, cfg


def trained(backend, adapter):
    from scope.parallel import named_trainable

    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in named_trainable(backend.model, adapter)}


def main(spec_path: str) -> None:
    torch.set_num_threads(1)
    with open(spec_path) as f:
        spec = json.load(f)
    if spec["kind"] == "train":
        from scope.config import parse_config
        from scope.train import train

        train(parse_config(spec["config"]), resume=spec.get("resume", False), log=lambda s: None)
        return
    from scope.config import parse_config
    from scope.parallel import DistLearner, start

    cfg = parse_config({"parallel": {"agent": {"strategy": spec["strategy"]}}})
    job = start(cfg, ["agent"])
    b, adapter, lc = learner_parts(spec["finetune"], spec.get("micro_batch_tokens", 40))
    start_weights = trained(b, adapter)  # every rank builds the same weights (seeded): rank 0's are sent anyway
    learner = DistLearner(job, job.placements["agent"], b, adapter, lc)
    learner.load_weights(start_weights)
    traces, advs = batch(len(b.tokenizer), shared=spec.get("shared", 0))
    m = learner.update(traces, advs)
    w = trained(b, adapter)
    if job.rank == 0:
        torch.save({"weights": w, "metrics": m}, os.path.join(spec["out"], "rank0.pt"))
    job.close(together=True)


if __name__ == "__main__":
    main(sys.argv[1])
