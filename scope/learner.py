"""Group-relative policy optimisation on whole multi-turn trajectories.

advantage = (R - mean_group) / std_group, given to every trainable token of a trajectory (groups
with zero std get 0 and are counted). Per token: clipped importance ratio against the rollout
log-probs (eps_low / eps_high), plus an optional k3 KL to the frozen reference; the loss is the
mean over all trainable tokens of the batch. AdamW, gradient-norm clip, micro-batches with gradient
accumulation. Log-probs are of logits / temperature, the distribution the rollout sampled from.

The output layer is applied a few hundred tokens at a time (``token_logprobs``): the [tokens, vocab]
logits of a whole micro-batch, and the four or five copies of them that a plain log-softmax with
autograd keeps, never exist at once; the backward pass recomputes each chunk's logits.

Traces that begin alike (a group's prompt) go into the same micro-batch, and their common beginning runs
through the decoder once, its keys and values shared by every row (``shared_prefix``, ``LogProbs``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .memory import allocator, pin_mmap_threshold, release_free_memory
from .models.decode import base_model
from .models.backend import LocalBackend
from .models.loading import clone_frozen
from .types import Episode, Trace


# ---- log-probs of chosen tokens, the output layer applied in chunks ---------------------------
HEAD_CHUNK = 256  # rows of the output layer per chunk: [256, vocab] float32 is 48 MB at vocab 49k


class _ChunkedLogProbs(torch.autograd.Function):
    """log p(target) and the entropy (no gradient) of softmax((h W^T + b) / T), row chunk by row chunk."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, temperature: float, chunk: int):
        logp = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
        ent = torch.empty_like(logp)
        lse = torch.empty_like(logp)
        for s in range(0, h.shape[0], chunk):
            z = torch.nn.functional.linear(h[s:s + chunk], weight, bias).float() / temperature
            lse[s:s + chunk] = lz = torch.logsumexp(z, -1)
            logp[s:s + chunk] = z.gather(-1, targets[s:s + chunk, None])[:, 0] - lz
            ent[s:s + chunk] = lz - (torch.softmax(z, -1) * z).sum(-1)
        ctx.save_for_backward(h, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, _g_ent):
        h, weight, bias, targets, lse = ctx.saved_tensors
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        gh = torch.empty_like(h) if want_h else None
        gw = torch.zeros_like(weight, dtype=torch.float32) if want_w else None
        gb = torch.zeros_like(bias, dtype=torch.float32) if want_b else None
        for s in range(0, h.shape[0], ctx.chunk):
            hc, g = h[s:s + ctx.chunk], g_logp[s:s + ctx.chunk].float()
            z = torch.nn.functional.linear(hc, weight, bias).float() / ctx.temperature
            # d log p(t) / dz = onehot(t) - softmax(z), scaled by the incoming gradient and 1/T
            dz = torch.exp(z - lse[s:s + ctx.chunk, None]).mul_(-g[:, None])
            dz.scatter_add_(-1, targets[s:s + ctx.chunk, None], g[:, None])
            dz.div_(ctx.temperature)
            if want_h:
                gh[s:s + ctx.chunk] = dz.to(h.dtype) @ weight
            if want_w:
                gw += dz.t() @ hc.float()
            if want_b:
                gb += dz.sum(0)
        return (gh, gw.to(weight.dtype) if want_w else None, gb.to(bias.dtype) if want_b else None,
                None, None, None)


def token_logprobs(head, h: torch.Tensor, targets: torch.Tensor, temperature: float,
                   chunk: int = HEAD_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of each target, entropy of each row) under softmax(head(h) / temperature), float32.

    A plain ``nn.Linear`` head goes through the chunked function; any other head (an adapter on the
    output layer, say) is applied whole."""
    if type(head) is torch.nn.Linear:
        return _ChunkedLogProbs.apply(h, head.weight, head.bias, targets, temperature, chunk)
    logp_all = torch.log_softmax(head(h).float() / temperature, -1)
    with torch.no_grad():
        ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, targets[:, None])[:, 0], ent


# ---- the loss -----------------------------------------------------------------------------------
@dataclass
class LossTerms:
    """Per trained token: the loss and its parts (``grpo_loss``'s output)."""

    loss: torch.Tensor      # pg + kl_coef * kl
    pg: torch.Tensor        # the clipped policy-gradient term
    kl: torch.Tensor        # the k3 estimate of KL(policy || reference); 0 without a reference
    ratio: torch.Tensor     # exp(logp - old_logp)
    clipped: torch.Tensor   # where the clip took the gradient away (bool)


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, ref_logp: torch.Tensor | None,
              eps_low: float, eps_high: float, kl_coef: float, is_weight: torch.Tensor | None = None) -> LossTerms:
    """The per-token GRPO loss, a pure function of tensors of the trained tokens.

    - Clipped surrogate (PPO, Schulman et al. 2017): ``pg = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``
      with ``r = exp(logp - old_logp)``, the ratio to the log-probs the rollout sampled with; the asymmetric
      clip (``eps_high`` > ``eps_low``) is DAPO's "clip-higher" (Yu et al. 2025).
    - KL to the reference (GRPO, Shao et al. 2024, with Schulman's k3 estimator):
      ``kl = exp(ref - logp) - (ref - logp) - 1``, non-negative and unbiased for KL(policy || reference).
    - ``A`` is the trajectory's group-relative advantage, the same on every token of it.
    - ``is_weight`` (no gradient): a per-token importance weight on ``pg``, truncated importance sampling
      (``Learner``'s ``tis_cap``); ``old_logp`` is then the learner's own log-probs at the update's start.

    The caller averages ``loss`` over the minibatch's trained tokens. ``clipped`` marks the tokens whose
    gradient the clip removed (ratio past its bound on the side the advantage pushes)."""
    ratio = torch.exp(logp - old_logp)
    pg = -torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
    if is_weight is not None:
        pg = pg * is_weight
    kl = torch.zeros_like(pg)
    loss = pg
    if ref_logp is not None:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1
        loss = pg + kl_coef * kl
    with torch.no_grad():
        clipped = ((ratio < 1 - eps_low) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
    return LossTerms(loss=loss, pg=pg, kl=kl, ratio=ratio, clipped=clipped)


# ---- advantages -------------------------------------------------------------------------------
@dataclass
class GroupStats:
    n_groups: int = 0
    zero_variance: int = 0
    all_success: int = 0
    all_failure: int = 0
    failed_episodes: int = 0

    def fractions(self) -> dict[str, float]:
        n = max(self.n_groups, 1)
        return {"zero_variance_frac": self.zero_variance / n, "all_success_frac": self.all_success / n,
                "all_failure_frac": self.all_failure / n}


STEP_STD_FLOOR = 0.1
"""The step baseline divides by max(std, this): rewards on [0, 1] that barely differ across the step stay
small advantages instead of being blown up to +-1 (z-scoring 16 near-equal values makes noise a signal)."""


def group_advantages(episodes: Sequence[Episode], role: str, success_threshold: float = 1.0,
                     eps: float = 1e-6, baseline: str = "group",
                     std_floor: float = STEP_STD_FLOOR) -> tuple[list[float | None], GroupStats]:
    """Per-episode advantage for ``role`` (None for failed episodes, which are left out).

    ``baseline="group"``: z-score within each task's group (GRPO). ``"step"``: centred over every
    episode of the step and divided by max(std, ``std_floor``), for a reward that is constant within a
    group (the curriculum), whose within-group advantages would all be 0. The success/failure fractions
    are per task group either way; ``zero_variance`` counts the baseline groups that carried no signal.
    """
    stats = GroupStats()
    groups: dict[str, list[int]] = {}
    for i, ep in enumerate(episodes):
        if ep.failed or role not in ep.rewards:
            stats.failed_episodes += ep.failed
            continue
        groups.setdefault(ep.group_id, []).append(i)
    adv: list[float | None] = [None] * len(episodes)
    for idx in groups.values():
        r = torch.tensor([episodes[i].rewards[role] for i in idx], dtype=torch.float64)
        stats.n_groups += 1
        stats.all_success += bool((r >= success_threshold).all())
        stats.all_failure += bool((r <= 0).all())
    if baseline not in ("group", "step"):
        raise ValueError(f"baseline must be 'group' or 'step', not {baseline!r}")
    pools = list(groups.values()) if baseline == "group" else ([sum(groups.values(), [])] if groups else [])
    for idx in pools:
        r = torch.tensor([episodes[i].rewards[role] for i in idx], dtype=torch.float64)
        std = r.std(unbiased=False) if len(idx) > 1 else torch.tensor(0.0, dtype=torch.float64)
        if std < eps:
            stats.zero_variance += len(idx) if baseline == "step" else 1
            a = torch.zeros_like(r)
        elif baseline == "step":
            a = (r - r.mean()) / max(float(std), std_floor)
        else:
            a = (r - r.mean()) / (std + eps)
        for i, v in zip(idx, a.tolist()):
            adv[i] = v
    if baseline == "step":  # as a fraction of task groups: all of them carried no signal, or none did
        stats.zero_variance = stats.n_groups if stats.zero_variance else 0
    return adv, stats


# ---- the learner ------------------------------------------------------------------------------
@dataclass
class LearnerConfig:
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.1
    eps_low: float = 0.2
    eps_high: float = 0.28
    kl_coef: float = 0.005
    grad_clip: float = 1.0
    micro_batch_tokens: int = 1024
    num_minibatches: int = 1
    temperature: float = 0.7
    tis_cap: float | None = None
    """Truncated importance sampling (off: None). The clipped ratio is then taken against the learner's own
    log-probs at the start of the update (recomputed, no gradient), and each token's policy-gradient term is
    weighted by min(exp(learner - behaviour), tis_cap): the correction for tokens sampled by older weights (an
    asynchronous rollout) or by another engine. Off, the ratio is against the behaviour log-probs."""


class LogProbs(torch.nn.Module):
    """The learner's forward pass as a module: the log-prob (and entropy) of every selected token, position
    t-1 predicting token t, under softmax(logits / temperature). Data-parallel wrappers (DDP, FSDP2) wrap
    this module, so that their hooks see the whole forward, output layer included."""

    def __init__(self, model: Any, temperature: float):
        super().__init__()
        self.model: Any = model  # a transformers model, or PEFT's wrapper of one
        self.temperature = temperature

    def forward(self, ids: torch.Tensor, att: torch.Tensor, sel: torch.Tensor,
                prefix: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``prefix``: the first ``prefix`` tokens are the same in every row and none of them is selected, nor the
        token after them: the decoder runs over them once, and every row's remainder attends to that one pass
        (the same numbers as running each row whole, within float rounding; gradients flow through it)."""
        base = base_model(self.model)
        dec = base.get_decoder()
        if prefix <= 0:
            hidden = dec(input_ids=ids, attention_mask=att).last_hidden_state
            h = hidden[:, :-1][sel[:, 1:]]  # position t-1 predicts token t
        else:
            hidden = _after_prefix(self.model, dec, ids, att, prefix)  # positions prefix .. L-1
            h = hidden[:, :-1][sel[:, prefix + 1:]]
        return token_logprobs(base.get_output_embeddings(), h, ids[sel], self.temperature)


def _after_prefix(model, dec, ids: torch.Tensor, att: torch.Tensor, prefix: int) -> torch.Tensor:
    """The decoder's last hidden states at positions ``prefix`` .. L-1 of every row, the shared first ``prefix``
    tokens run once (row 0's) and their keys and values given to every row."""
    from .models.decode import cache_kw
    from .models.readout import select_cache_rows

    out = dec(input_ids=ids[:1, :prefix], use_cache=True)
    cache = select_cache_rows(model, out.cache if "cache" in out else out.past_key_values,
                    torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device))
    pos = torch.arange(prefix, ids.shape[1], device=ids.device)[None]
    return dec(input_ids=ids[:, prefix:], attention_mask=att, position_ids=pos, use_cache=True,
               **{cache_kw(model): cache}).last_hidden_state


MIN_SHARED_PREFIX = 32
"""A micro-batch's traces that begin with at least this many tokens in common run them once (``LogProbs``)."""


def _first_trained(t: Trace) -> int:
    """The index of a trace's first trained token (its length if none)."""
    return next((i for i in range(1, len(t.mask)) if t.mask[i]), len(t.mask))


def shared_prefix(traces: Sequence[Trace]) -> int:
    """How many tokens at the start of every trace the learner runs once for all of them: their common beginning,
    ending at least one token before any trained token (whose log-prob is read at the position before it); 0
    for a single trace or a common beginning shorter than ``MIN_SHARED_PREFIX``. (GRPO's group shares its
    prompt: at G samples a task, the prompt is run once instead of G times.)"""
    if len(traces) < 2:
        return 0
    cap = min(_first_trained(t) for t in traces) - 1
    first = traces[0].token_ids
    p = min(cap, min(len(t.token_ids) for t in traces))
    for t in traces[1:]:
        ids = t.token_ids
        i = 0
        while i < p and ids[i] == first[i]:
            i += 1
        p = i
    return p if p >= MIN_SHARED_PREFIX else 0


def _run_tokens(traces: Sequence[Trace], share: bool = True) -> int:
    """The tokens a micro-batch of ``traces`` runs: the shared beginning once (if ``share``), each row's rest
    padded."""
    p = shared_prefix(traces) if share else 0
    return p + len(traces) * (max(len(t.token_ids) for t in traces) - p)


class Learner:
    """Updates one trainable ModelRef: a LoRA adapter of a backend, or its full weights."""

    world = 1
    """Ranks the gradients are averaged over (a data-parallel learner scales its loss by it)."""
    share_prefix = True
    """Whether the pass that trains runs a micro-batch's shared beginning once (``shared_prefix``). FSDP2's
    sharded layers cannot: their backward does not follow the keys and values handed from the prefix's pass
    to the rest, so the gradient would meet freed parameters."""

    def __init__(self, backend: LocalBackend, adapter: str | None, cfg: LearnerConfig):
        self.backend, self.adapter, self.cfg = backend, adapter, cfg
        self._prox: dict[int, torch.Tensor] | None = None  # (truncated importance sampling's, during an update)
        if os.environ.get("SCOPE_PIN_MMAP", "1") != "0" and allocator() == "glibc":  # 0: glibc's default
            pin_mmap_threshold()  # the update's peak stays flat over steps and adapters (jemalloc's does anyway)
        self.params = backend.set_trainable(adapter)
        self.module: Any = LogProbs(backend.model, cfg.temperature)  # (or its DDP / FSDP2 wrapping)
        self.ref_model: Any = None
        if cfg.kl_coef > 0 and adapter is None:  # full fine-tuning needs its own frozen copy
            self.ref_model = LogProbs(clone_frozen(backend.model), cfg.temperature)
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]),
                                           weight_decay=cfg.weight_decay)

    def _batch(self, traces: Sequence[Trace]):
        L = max(len(t.token_ids) for t in traces)
        pad = self.backend.pad_id
        ids = torch.full((len(traces), L), pad, dtype=torch.long)
        att = torch.zeros((len(traces), L), dtype=torch.long)
        sel = torch.zeros((len(traces), L), dtype=torch.bool)
        old: list[float] = []
        for i, t in enumerate(traces):
            n = len(t.token_ids)
            ids[i, :n] = torch.tensor(t.token_ids)
            att[i, :n] = 1
            m = torch.tensor(t.mask, dtype=torch.bool)
            m[0] = False  # the first token has no prediction
            sel[i, :n] = m
            old.extend(lp for lp, mk in zip(t.logprobs[1:], t.mask[1:]) if mk)
        return ids, att, sel, torch.tensor(old, dtype=torch.float32)

    def _micro_batches(self, items: list[tuple[Trace, float]]) -> list[list[tuple[Trace, float]]]:
        """Micro-batches of at most ``micro_batch_tokens`` tokens run, traces that begin alike side by side: a
        micro-batch's shared beginning (``shared_prefix``) is run once, so it counts once."""
        items = sorted(items, key=lambda x: (x[0].token_ids[:_first_trained(x[0])], len(x[0].token_ids)))
        out: list[list[tuple[Trace, float]]] = []
        cur: list[tuple[Trace, float]] = []
        for it in items:
            if cur and _run_tokens([t for t, _ in cur] + [it[0]], self.share_prefix) > self.cfg.micro_batch_tokens:
                out.append(cur)
                cur = []
            cur.append(it)
        if cur:
            out.append(cur)
        return out

    def _token_logprobs(self, model, ids: torch.Tensor, att: torch.Tensor, sel: torch.Tensor):
        """(log-prob, entropy) of the selected tokens under ``model`` at the learner's temperature."""
        return LogProbs(model, self.cfg.temperature)(ids, att, sel)

    @staticmethod
    def items(traces: Sequence[Trace], advantages: Sequence[float | None]) -> list[tuple[Trace, float]]:
        """The (trace, advantage) pairs an update trains on: episodes with an advantage and generated tokens."""
        return [(t, a) for t, a in zip(traces, advantages) if a is not None and t.n_generated > 0]

    @staticmethod
    def n_tokens(items: Sequence[tuple[Trace, float]]) -> int:
        """The trainable tokens of ``items`` (a trace's first token has no prediction): the loss's divisor."""
        return sum(t.n_generated - t.mask[0] for t, _ in items)

    def minibatches(self, items: list[tuple[Trace, float]]) -> list[list[tuple[Trace, float]]]:
        n_mb = max(1, min(self.cfg.num_minibatches, len(items)))
        return [items[k::n_mb] for k in range(n_mb)]

    def update(self, traces: Sequence[Trace], advantages: Sequence[float | None]) -> dict[str, float]:
        items = self.items(traces, advantages)
        if not items:
            return {"trained_sequences": 0}
        agg: dict[str, float] = {}
        tot_tokens = 0
        minibatches = self.minibatches(items)
        self._begin()
        try:
            self._prox = self._proximal(items) if self.cfg.tis_cap is not None else None
            for mb in minibatches:
                n_tok = self.n_tokens(mb)
                self.optimizer.zero_grad(set_to_none=True)
                for m in self._accumulate(mb, n_tok):
                    for k, v in m.items():
                        agg[k] = agg.get(k, 0.0) + v
                self._step(agg, len(minibatches))
                tot_tokens += n_tok
        finally:
            self._end()
        return self._summary(agg, len(items), tot_tokens)

    # -- the pieces of an update (a data-parallel learner replaces _accumulate and _reduce) --
    def _begin(self) -> None:
        release_free_memory()  # what the rollout freed (its KV slabs) is not reused by the update's buffers
        self.module.train()
        for p in self.params:  # (a loaded or copied adapter may have requires_grad off)
            p.requires_grad_(True)

    @torch.no_grad()
    def _proximal(self, items: list[tuple[Trace, float]]) -> dict[int, torch.Tensor]:
        """Each trace's trained tokens' log-probs under the weights as they are now (before this update's first
        step), keyed by ``id(trace)``: truncated importance sampling's reference. Every rank of a data-parallel
        learner runs the same passes, in the same order."""
        out: dict[int, torch.Tensor] = {}
        dev = getattr(self.backend, "device", torch.device("cpu"))
        self.module.eval()
        try:
            for micro in self._micro_batches(items):
                traces = [t for t, _ in micro]
                ids, att, sel, _ = (x.to(dev) for x in self._batch(traces))
                with self.backend.using(self.adapter):
                    logp = self.module(ids, att, sel, shared_prefix(traces) if self.share_prefix else 0)[0]
                for t, chunk in zip(traces, torch.split(logp.float(), sel.sum(1).tolist())):
                    out[id(t)] = chunk
        finally:
            self.module.train()
        return out

    def _end(self) -> None:
        self._prox = None
        self.module.eval()
        release_free_memory()
        self.backend.versions[self.adapter] = self.backend.versions.get(self.adapter, 0) + 1

    def _accumulate(self, mb: list[tuple[Trace, float]], n_tok: int):
        """Forward and backward over ``mb``'s micro-batches, gradients accumulated; yields each one's sums."""
        for micro in self._micro_batches(mb):
            yield self._micro_step(micro, n_tok)

    def _step(self, agg: dict[str, float], n_mb: int) -> None:
        gn = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        gn = gn.full_tensor() if hasattr(gn, "full_tensor") else gn  # (a sharded model's norm is a DTensor)
        if not torch.isfinite(gn):
            self.optimizer.zero_grad(set_to_none=True)
            agg["skipped_nonfinite"] = agg.get("skipped_nonfinite", 0) + 1
        else:
            self.optimizer.step()
        agg["grad_norm"] = agg.get("grad_norm", 0.0) + float(gn) / n_mb

    def _reduce(self, agg: dict[str, float]) -> dict[str, float]:
        """The sums of every rank's share (one process: its own)."""
        return agg

    def _summary(self, agg: dict[str, float], n_items: int, tot_tokens: int) -> dict[str, float]:
        agg = self._reduce(agg)
        out = {k[4:]: v / max(tot_tokens, 1) for k, v in agg.items() if k.startswith("sum_")}
        out.update(grad_norm=agg.get("grad_norm", 0.0), trained_sequences=n_items, trained_tokens=tot_tokens,
                   skipped_nonfinite=agg.get("skipped_nonfinite", 0))
        return out

    def _micro_step(self, micro: list[tuple[Trace, float]], n_tok_total: int, weight: float = 1.0) -> dict[str, float]:
        """Forward and backward of one micro-batch; its loss is its share of the minibatch's mean over
        ``n_tok_total`` tokens, times ``self.world`` (a data-parallel wrapper averages the ranks' gradients)
        and ``weight`` (0 for the empty micro-batches that keep a rank in step with the others)."""
        cfg = self.cfg
        traces = [t for t, _ in micro]
        dev = getattr(self.backend, "device", torch.device("cpu"))
        ids, att, sel, old = (x.to(dev) for x in self._batch(traces))
        p = shared_prefix(traces)  # (the reference pass, without gradients, shares it always)
        adv = torch.cat([torch.full((int(sel[i].sum()),), float(a)) for i, (_, a) in enumerate(micro)]).to(dev)
        ref_logp = None
        if cfg.kl_coef > 0:
            with torch.no_grad():
                if self.ref_model is not None:
                    ref_logp = self.ref_model(ids, att, sel, p)[0]
                else:
                    with self.backend.using(None):
                        ref_logp = self.module(ids, att, sel, p)[0]
        # the adapter stays active through backward: switching adapters changes which weights require grad
        with self.backend.using(self.adapter):
            logp, entropy = self.module(ids, att, sel, p if self.share_prefix else 0)
            is_weight, extra = None, {}
            known = getattr(self, "_prox", None)
            if known is not None and cfg.tis_cap is not None:
                prox = torch.cat([known[id(t)] for t in traces]).to(dev)
                r = torch.exp(prox - old)  # learner / behaviour, per token
                is_weight = r.clamp(max=cfg.tis_cap)
                extra = {"sum_mismatch_kl": float((r - 1 - (prox - old)).sum()),  # k3 of KL(behaviour || learner)
                         "sum_tis_truncated": float((r > cfg.tis_cap).float().sum())}
                old = prox
            t = grpo_loss(logp, old, adv, ref_logp, cfg.eps_low, cfg.eps_high, cfg.kl_coef, is_weight)
            loss = t.loss.sum() / n_tok_total
            if self.world != 1 or weight != 1.0:
                loss = loss * (self.world * weight)
            loss.backward()
        if not weight:
            return {}
        return {"sum_loss": float(t.loss.detach().sum()), "sum_pg_loss": float(t.pg.detach().sum()),
                "sum_kl": float(t.kl.detach().sum()), "sum_entropy": float(entropy.sum()),
                "sum_clip_frac": float(t.clipped.float().sum()), "sum_ratio": float(t.ratio.detach().sum()), **extra}

    # -- state --
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "version": self.backend.versions.get(self.adapter, 0)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if "optimizer" in sd:  # (a checkpoint of a distributed run keeps it in dist_<role>/ only)
            self.optimizer.load_state_dict(sd["optimizer"])
        self.backend.versions[self.adapter] = sd["version"]

    # -- the training state as torch.distributed.checkpoint writes it (any world size reads it back) --
    def _group(self):
        """The process group of a distributed learner; None: one process."""
        return None

    def _dcp_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model, optim = get_state_dict(self.module, self.optimizer, options=StateDictOptions(ignore_frozen_params=True))
        if self.adapter is not None:  # (other adapters on the same base train too, with learners of their own)
            model = {k: v for k, v in model.items() if f".{self.adapter}." in k and "lora_" in k}
        return {"model": model, "optim": optim}

    def save_dcp(self, path: str) -> None:
        """The trainable weights and the optimizer, sharded as they are, into ``path`` (DCP)."""
        import torch.distributed.checkpoint as dcp

        import warnings

        g = self._group()
        with warnings.catch_warnings():  # (one process: DCP says it assumes so)
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.save(self._dcp_state(), checkpoint_id=path, process_group=g, no_dist=g is None)

    def load_dcp(self, path: str) -> None:
        """The state :meth:`save_dcp` wrote, from a run of any world size (DCP reshards it)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        import warnings

        g = self._group()
        st = self._dcp_state()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.load(st, checkpoint_id=path, process_group=g, no_dist=g is None)
        set_state_dict(self.module, self.optimizer, model_state_dict=st["model"], optim_state_dict=st["optim"],
                       options=StateDictOptions(ignore_frozen_params=True, strict=False))
