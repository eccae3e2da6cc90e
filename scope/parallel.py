"""The learner on torch.distributed: each trained model data-parallel (DDP) or sharded (FSDP2) over its own
ranks, rollouts on rank 0.

Launch: ``torchrun --nproc-per-node N -m scope.cli train --config ...`` (or set ``RANK``, ``WORLD_SIZE`` and
``SCOPE_DIST_INIT`` yourself, e.g. ``file:///tmp/store`` for a FileStore, as the tests do). A run started
without them (``WORLD_SIZE`` unset or 1) is the one-process run, unchanged. ``parallel.<role>.ranks``
places each trained model (default: every rank) and ``parallel.<role>.strategy`` chooses ``ddp`` or ``fsdp``;
the agent and a co-trained simulator may sit on disjoint ranks, each with its own process group, so that
each model's gradients are reduced within its own group.

The shape of a job (after verl's and OpenRLHF's: the generation side is one place, the trainers are
groups of ranks, weights flow from the trainers to the generation side after every update):

- **Rank 0 keeps the rollout side**: sources, the engine (or vLLM, Ray workers), evaluation, metrics and
  the run directory, exactly as in one process. Its models are the generation copies.
- **Every rank of a model's group holds a training copy** of that model (the same base and LoRA adapter,
  or full weights), wrapped in DDP or FSDP2, and an optimizer (FSDP2: over its shards). The training copy
  starts from rank 0's generation weights.
- **Commands.** Rank 0 drives the other ranks with commands broadcast over the world group: ``update``
  (one model's traces and advantages: every rank takes its share), ``save`` (a checkpoint), ``stop``
  (the run ended, or failed: the others end with an error naming rank 0's). A rank that is not in a model's
  group takes no part in its update.
- **Shares.** Every rank of the group receives the whole list and takes its share by itself: traces sorted
  by length and dealt greedily to the rank with the fewest tokens (balanced by tokens), the same on every
  rank. The loss is normalised by the minibatch's tokens over all ranks and multiplied by the group's size
  (DDP and FSDP2 average gradients over the group): the gradient is that of one process over the whole
  minibatch. Every rank runs the same number of micro-batches (a rank short of them runs zero-weighted ones;
  gloo aborts and NCCL hangs on unequal collectives) and accumulates without synchronising until its last.
- **Weight sync.** After an update the group gathers the trained weights (``full_tensor`` of each shard) and
  the group's first rank sends them to rank 0, which copies them into its generation copy and bumps its
  version. LoRA: the adapter's tensors only (a few MB). Full fine-tuning: the whole state dict, gathered and
  sent at once: for a 4B model in bfloat16 that is 8 GB through rank 0's memory per update (a streamed,
  per-parameter sync is the GPU recipe's job, not built here).
- **Checkpoints.** ``torch.distributed.checkpoint`` (DCP) writes each model's training state (trainable
  weights and optimizer, sharded as they are) into the checkpoint's ``dist_<role>/``, each model with its own
  process group, inside the checkpoint's temporary directory; rank 0 publishes the directory only after
  every rank has written (a barrier), so a crash at any moment leaves the last published checkpoint whole.
  DCP reshards on load: a run resumes with the same or another world size, one process included (which
  reads ``dist_<role>/`` with ``no_dist``).
- **Metrics.** Each model's update sums are reduced over its group; each rank's update time and resident
  memory are logged by rank 0 as ``rank<r>/<role>/update_seconds`` and ``rank<r>/rss_gb``.

A rank killed with SIGKILL ends the job: the others fail at their next collective (gloo reports the closed
connection) and torchrun stops the rest; no published checkpoint is touched.

Networking: a TCPStore (torchrun's too) listens on every interface even when given 127.0.0.1; the tests use
a FileStore and ``GLOO_SOCKET_IFNAME=lo``; a multi-machine job needs a private network.
"""
from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist

from .learner import Learner, LearnerConfig
from .models.decode import base_model
from .types import Trace


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def ranks_of(cfg, owner: str, size: int) -> tuple[list[int], str]:
    """The ranks and the strategy of the trained model ``owner`` (``parallel.<owner>``: agent, partner or envsim)
    in a world of ``size`` ranks; ranks outside it, or none, are a ``ValueError`` naming the key."""
    pc = getattr(cfg.parallel, owner)
    ranks = sorted(pc.ranks) if pc.ranks is not None else list(range(size))
    bad = [r for r in ranks if not 0 <= r < size]
    if not ranks or bad:
        raise ValueError(f"parallel.{owner}.ranks: {pc.ranks} is not a non-empty subset of the {size} ranks "
                         f"(0-{size - 1})")
    return ranks, pc.strategy


@dataclass
class Placement:
    """Where one trained model lives: its ranks, its process group and how it is wrapped."""

    owner: str
    ranks: list[int]
    strategy: str
    group: Any = None
    pair: Any = None  # the group of rank 0 and the model's first rank, for the weight sync (None if that is 0)

    @property
    def leader(self) -> int:
        return self.ranks[0]


class DistJob:
    """This process's part in a distributed run: its rank, the world, and each trained model's placement."""

    def __init__(self, cfg, owners: Sequence[str]):
        self.rank, self.size = rank(), world_size()
        backend = cfg.parallel.backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() and cfg.models[cfg.agent.model].device != "cpu" else "gloo"
        init = os.environ.get("SCOPE_DIST_INIT", "env://")
        if backend == "nccl":  # each rank on its own GPU (collectives of Python objects go through it)
            torch.cuda.set_device(local_rank())
        if not dist.is_initialized():
            dist.init_process_group(backend, init_method=init, rank=self.rank, world_size=self.size,
                                    timeout=datetime.timedelta(seconds=cfg.parallel.timeout))
        self.placements: dict[str, Placement] = {}
        for owner in owners:  # every rank creates every group, in the same order
            ranks, strategy = ranks_of(cfg, owner, self.size)
            p = Placement(owner, ranks, strategy, group=dist.new_group(ranks))
            if p.leader != 0:
                p.pair = dist.new_group([0, p.leader])
            self.placements[owner] = p

    @property
    def main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any = None, src: int = 0, group=None) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=group)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()

    def close(self, together: bool = False) -> None:
        """End this rank's part. ``together`` (a normal end, reached by every rank): wait for the others first,
        so that no rank tears its connections down while a peer still uses them (a rank whose peer had
        already gone was seen to abort in the teardown)."""
        if dist.is_initialized():
            if together:
                dist.barrier()
            dist.destroy_process_group()


def start(cfg, owners: Sequence[str]) -> DistJob | None:
    """The distributed job of this process, or None for a one-process run (``WORLD_SIZE`` unset or 1)."""
    if world_size() <= 1:
        return None
    return DistJob(cfg, owners)


# ---- the training copy and its learner -------------------------------------------------------------------
def shares(items: Sequence[tuple[Trace, float]], n: int) -> list[list[int]]:
    """Indices of ``items`` dealt to ``n`` ranks, balanced by tokens: longest first, each to the rank with the
    fewest tokens so far (the lowest rank on a tie); the same on every rank."""
    order = sorted(range(len(items)), key=lambda i: (-len(items[i][0].token_ids), i))
    load = [0] * n
    out: list[list[int]] = [[] for _ in range(n)]
    for i in order:
        r = min(range(n), key=lambda k: (load[k], k))
        out[r].append(i)
        load[r] += len(items[i][0].token_ids)
    return [sorted(x) for x in out]


class DistLearner(Learner):
    """A Learner over a training copy wrapped in DDP or FSDP2 on its placement's ranks (see the module
    docstring). ``update`` takes the whole minibatch on every rank of the group and trains on its share."""

    def __init__(self, job: DistJob, placement: Placement, backend, adapter: str | None, cfg: LearnerConfig):
        super().__init__(backend, adapter, cfg)
        self.job, self.placement = job, placement
        self.world = len(placement.ranks)
        self.local = placement.ranks.index(job.rank)
        if placement.strategy == "fsdp":
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.fsdp import fully_shard

            mesh = DeviceMesh.from_group(placement.group, device_type=backend.device.type)
            layers = _layers(backend.model)
            for layer in layers:
                fully_shard(layer, mesh=mesh)
            self.module = fully_shard(self.module, mesh=mesh)
            self.share_prefix = False
            if self.ref_model is not None:
                for layer in _layers(self.ref_model.model):
                    fully_shard(layer, mesh=mesh)
                self.ref_model = fully_shard(self.ref_model, mesh=mesh)
        else:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.module = DDP(self.module, process_group=placement.group)
        # (FSDP2 turns parameters into shards: the optimizer is made over what the module holds now)
        self.params = [p for n, p in named_trainable(self.module, adapter)]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]),
                                           weight_decay=cfg.weight_decay)
        self.timing: dict[str, float] = {}

    def update(self, traces: Sequence[Trace], advantages: Sequence[float | None]) -> dict[str, float]:
        t0 = time.time()
        out = super().update(traces, advantages)
        self.timing = {"update_seconds": time.time() - t0}
        return out

    def _accumulate(self, mb: list[tuple[Trace, float]], n_tok: int):
        per_rank = shares(mb, self.world)
        counts = [len(self._micro_batches([mb[i] for i in ix])) if ix else 0 for ix in per_rank]
        mine = self._micro_batches([mb[i] for i in per_rank[self.local]]) if per_rank[self.local] else []
        filler = [min(mb, key=lambda it: len(it[0].token_ids))]  # a zero-weighted stand-in
        steps = max(counts)
        for k in range(steps):
            last = k == steps - 1
            with self._sync(last):
                if k < len(mine):
                    yield self._micro_step(mine[k], n_tok)
                else:
                    self._micro_step(filler, n_tok, weight=0.0)

    def _sync(self, on: bool):
        """Reduce gradients across the group on this backward only if ``on`` (the last micro-batch)."""
        import contextlib

        if self.placement.strategy == "fsdp":
            self.module.set_requires_gradient_sync(on)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if on else self.module.no_sync()

    def _reduce(self, agg: dict[str, float]) -> dict[str, float]:
        keys = sorted(k for k in agg if k.startswith("sum_"))
        vals = torch.tensor([agg[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(vals, group=self.placement.group)
        out = dict(agg)
        out.update(zip(keys, vals.tolist()))
        return out

    # -- weights --
    def trained_state(self) -> dict[str, torch.Tensor]:
        """The trained weights, whole, on the group's first rank (a collective over the group: every rank must
        call it; the others get an empty dict), keyed as the generation copy names them. One parameter is
        gathered at a time, so a rank holds one whole parameter beyond its shards at once."""
        out = {}
        for name, p in named_trainable(self.backend.model, self.adapter):
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            if self.local == 0:
                out[name] = t.detach().cpu().clone()
            del t
        return out

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Copy whole weights (the generation copy's, at the start) into this training copy's shards."""
        for name, p in named_trainable(self.backend.model, self.adapter):
            if name not in state:
                raise KeyError(f"parallel: weight {name!r} missing from rank 0's {self.placement.owner} state")
            src = state[name].to(dtype=p.dtype)
            with torch.no_grad():
                if hasattr(p, "full_tensor"):  # a DTensor: take this rank's shard of the whole tensor
                    from torch.distributed.tensor import distribute_tensor

                    p.copy_(distribute_tensor(src.to(p.device), p.device_mesh, p.placements))
                else:
                    p.copy_(src.to(p.device))

    def _group(self):
        return self.placement.group


def _layers(model) -> list[torch.nn.Module]:
    base = base_model(model)
    inner = getattr(base, "model", base)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"parallel fsdp: cannot find the transformer layers of {type(base).__name__}")
    return list(layers)


def named_trainable(module: torch.nn.Module, adapter: str | None):
    """(name, parameter) of what trains: the adapter's LoRA weights, or every weight (full fine-tuning)."""
    for n, p in module.named_parameters():
        if adapter is None or (f".{adapter}." in n and "lora_" in n):
            yield n, p


def rss_gb() -> float:
    """This process's resident memory in GB (Linux; nan elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (OSError, ValueError, IndexError):
        return float("nan")


# ---- the job: rank 0's side and the other ranks' loop ---------------------------------------------------
def owners_of(cfg) -> list[str]:
    """The trained models of a run, in the order their learners are built (a self-play role trains with the
    agent's weights, so it has none of its own)."""
    out: list[str] = []
    for role, rc in cfg.roles().items():
        owner = "agent" if rc.self_play else role
        if rc.trainable and owner not in out:
            out.append(owner)
    return out


def training_copy(cfg, owner: str, seed: int):
    """A fresh copy of ``owner``'s model to train: the same base (and LoRA settings) as the generation copy."""
    from .models.loading import open_backend

    rc = cfg.roles()[owner]
    mc = cfg.models[rc.model]
    if mc.device != "cpu" and torch.cuda.is_available():  # a training copy on this rank's own GPU
        mc = mc.model_copy(update={"device": f"cuda:{local_rank()}", "backend": "local"})
    else:
        mc = mc.model_copy(update={"backend": "local"})  # (an engine samples for the generation copy only)
    b = open_backend(mc, f"{rc.model}#train", seed=seed)
    if mc.finetune == "lora":
        b.add_lora(owner, **mc.lora.model_dump())
        return b, owner
    return b, None


def build_learners(job: DistJob, cfg, owners: Sequence[str], configs: dict[str, LearnerConfig],
                   generation: dict[str, Any] | None = None) -> dict[str, DistLearner]:
    """This rank's learners (the models whose group holds it), each starting from rank 0's generation
    weights (``generation``: owner -> ModelRef, on rank 0), broadcast to every rank. Every rank calls this,
    in the same order."""
    out: dict[str, DistLearner] = {}
    for owner in owners:
        p = job.placements[owner]
        learner = None
        if job.rank in p.ranks:
            backend, adapter = training_copy(cfg, owner, cfg.run.seed)
            learner = DistLearner(job, p, backend, adapter, configs[owner])
            out[owner] = learner
        state = None
        if job.main:
            ref = (generation or {})[owner]
            state = {n: t.detach().cpu().clone() for n, t in named_trainable(ref.backend.model, ref.adapter)}
        state = job.broadcast(state)
        if learner is not None:
            learner.load_weights(state)
    return out


def sync_back(job: DistJob, owner: str, learner: DistLearner | None, metrics: dict[str, float] | None
              ) -> tuple[dict[str, torch.Tensor] | None, dict[str, float] | None]:
    """After ``owner``'s update: the group gathers its weights and timings; rank 0 receives them (weights,
    metrics with each rank's time and memory). Called by every rank of the group, and by rank 0."""
    p = job.placements[owner]
    payload = None
    if learner is not None:
        state = learner.trained_state()  # a collective over the group
        timing = {"rank": job.rank, "rss_gb": rss_gb(), **learner.timing}
        timings: list[Any] = [None] * len(p.ranks)
        dist.all_gather_object(timings, timing, group=p.group)
        if job.rank == p.leader:
            m = dict(metrics or {})
            for t in timings:
                m[f"rank{t['rank']}/{owner}/update_seconds"] = t.get("update_seconds", float("nan"))
                m[f"rank{t['rank']}/rss_gb"] = t["rss_gb"]
            payload = (state, m)
    if p.pair is not None and (job.main or job.rank == p.leader):
        payload = job.broadcast(payload, src=p.leader, group=p.pair)
    if job.main:
        return payload if payload is not None else (None, None)
    return None, None


class RemoteLearner:
    """Rank 0's handle on a model trained over its group: the loop calls ``update`` as on a Learner; the
    traces go to every rank, this rank trains on its share if it is in the group, and the trained weights
    come back into the generation copy (``ref``)."""

    def __init__(self, job: DistJob, owner: str, ref, local: DistLearner | None):
        self.job, self.owner, self.local = job, owner, local
        self.backend, self.adapter = ref.backend, ref.adapter  # the generation copy (checkpoints save it)

    def update(self, traces: Sequence[Trace], advantages: Sequence[float | None]) -> dict[str, float]:
        self.job.broadcast(("update", self.owner, list(traces), list(advantages)))
        out = self.local.update(traces, advantages) if self.local is not None else None
        state, metrics = sync_back(self.job, self.owner, self.local, out)
        if state is None or metrics is None:
            raise RuntimeError(f"parallel: no weights came back from {self.owner}'s learner")
        with torch.no_grad():
            named = dict(self.backend.model.named_parameters())
            for n, t in state.items():
                named[n].copy_(t.to(device=named[n].device, dtype=named[n].dtype))
        self.backend.versions[self.adapter] = self.backend.versions.get(self.adapter, 0) + 1
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.backend.versions.get(self.adapter, 0)}  # (the optimizer is in dist_<owner>/)

    def save_dcp(self, path: str) -> None:
        """(The ranks of the group write the training state: ``save_all``, from the checkpoint's hook.)"""

    def load_dcp(self, path: str) -> None:
        """(The ranks of the group read it: ``load_all``, after the checkpoint is loaded.)"""

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.backend.versions[self.adapter] = sd["version"]


def save_all(job: DistJob, learners: dict[str, DistLearner], owners: Sequence[str], path: str) -> None:
    """Every model's sharded training state into ``path/dist_<owner>`` (each over its own group), then a
    barrier: rank 0 publishes the checkpoint only after every rank has written."""
    for owner in owners:
        if owner in learners:
            learners[owner].save_dcp(os.path.join(path, f"dist_{owner}"))
    job.barrier()


def load_all(job: DistJob, learners: dict[str, DistLearner], owners: Sequence[str], path: str) -> None:
    """Every model's training state from ``path/dist_<owner>`` (resharded to this run's ranks)."""
    for owner in owners:
        if owner in learners:
            d = os.path.join(path, f"dist_{owner}")
            if not os.path.isdir(d):
                raise FileNotFoundError(f"parallel: {d} missing: the checkpoint has no training state of {owner}")
            learners[owner].load_dcp(d)
    job.barrier()


def follow(job: DistJob, cfg, owners: Sequence[str], configs: dict[str, LearnerConfig]) -> None:
    """The loop of every rank but 0: build this rank's learners, then do what rank 0 says until it stops."""
    learners = build_learners(job, cfg, owners, configs)
    while True:
        cmd = job.broadcast()
        kind = cmd[0]
        if kind == "update":
            _, owner, traces, advantages = cmd
            learner = learners.get(owner)
            out = learner.update(traces, advantages) if learner is not None else None
            if learner is not None:
                sync_back(job, owner, learner, out)
        elif kind == "save":
            save_all(job, learners, owners, cmd[1])
        elif kind == "load":
            load_all(job, learners, owners, cmd[1])
        elif kind == "stop":
            if cmd[1]:
                raise RuntimeError(f"rank 0 stopped the run: {cmd[1]}")
            return
        else:
            raise RuntimeError(f"parallel: unknown command {kind!r} from rank 0")
