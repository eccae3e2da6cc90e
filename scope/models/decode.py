"""The CPU engine's decode loop: batched sampling over one model, with per-dialogue key/value reuse.

``decode`` prefills a batch of prompts (reusing each row's cached prefix, and one shared prefix once for
all rows), then samples token by token in slabs of key/value memory that rows leave as they finish.
The data structures it keeps between calls (``KVEntry``) and its sampler live here; the backend that
calls it, and owns the cache, is :mod:`scope.models.backend`.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..types import Completion, SamplingParams
from . import attention as _attention


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    if list(a[:n]) == list(b[:n]):
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class KVEntry:
    ids: list[int]
    # per layer, in order, pieces of keys transposed [heads, head_dim, len] (the slab's layout, so
    # copies run along len) and values [heads, len, head_dim] that together cover ids[self.start:]
    # (views of the slab a call decoded in, or copies)
    layers: list[list[tuple[torch.Tensor, torch.Tensor]]]
    adapter: str | None
    version: int
    # an entry that holds ids[:self.start] once for many sessions (their common system prompt)
    shared: "KVEntry | None" = None

    @property
    def start(self) -> int:
        return len(self.shared.ids) if self.shared is not None else 0

    @property
    def root(self) -> "KVEntry":
        return self.shared if self.shared is not None else self

    def pieces(self, li: int, a: int, b: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Layer ``li``'s (transposed keys, values) covering token positions [a, b), in order."""
        if self.shared is not None and a < self.start:
            return self.shared.pieces(li, a, min(b, self.start)) + self.pieces(li, self.start, b)
        out, at = [], self.start
        for kt, v in self.layers[li]:
            m = kt.shape[-1]
            x, y = max(a, at), min(b, at + m)
            if y > x:
                out.append((kt[:, :, x - at:y - at], v[:, x - at:y - at]))
            at += m
        return out


PREFILL_CHUNK_TOKENS = 768
_uninitialized = torch.empty  # the tests fill new slabs with NaN instead, to show what is never read


def _slab_layer_class():
    from transformers.cache_utils import DynamicLayer

    class _SlabLayer(DynamicLayer):
        """A KV cache layer written in place into a preallocated slab (no per-step concatenation).

        Keys are stored transposed ([batch, heads, head_dim, capacity]) and handed out as a
        [batch, heads, length, head_dim] view of that memory, so that a decoding query's ``q @ K^T``
        reads the keys with unit stride (about a third faster for a 32-row batch on the CPU).
        """

        is_croppable = False

        def __init__(self, cap: int):
            super().__init__()
            self.cap, self.n = cap, 0
            self.rows = slice(None)   # the rows a forward pass covers (a chunk of the prefill)
            self.total_rows = None    # the batch size to allocate for (default: the first update's)
            self.rows_held = 0        # the rows the slab's memory holds (compaction does not shrink it)
            self.slab_kt: torch.Tensor | None = None
            self.slab_v: torch.Tensor | None = None
            self.keys = self.values = None
            self.is_initialized = False

        @property
        def slab_k(self):
            return None if self.slab_kt is None else self.slab_kt.transpose(-1, -2)

        def _alloc(self, b, h, d, dtype, device, zero: bool = True):
            # masked-out columns must hold finite numbers (a masked score still meets its value as
            # 0 * v); ``zero=False`` leaves that to the caller, who knows which columns get written
            new = torch.zeros if zero else _uninitialized
            self.slab_kt = new((b, h, d, self.cap), dtype=dtype, device=device)
            self.slab_v = new((b, h, self.cap, d), dtype=dtype, device=device)
            self.rows_held = b
            self.is_initialized = True

        def _views(self):
            self.keys, self.values = self.slab_k[self.rows, :, :self.n], self.slab_v[self.rows, :, :self.n]

        def update(self, key_states, value_states, *args, **kwargs):
            if self.slab_kt is None:
                b, h, _, d = key_states.shape
                self._alloc(self.total_rows or b, h, d, key_states.dtype, key_states.device)
            q = key_states.shape[-2]
            self.slab_kt[self.rows, :, :, self.n:self.n + q] = key_states.transpose(-1, -2)
            self.slab_v[self.rows, :, self.n:self.n + q] = value_states
            self.n += q
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.n

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.n + query_length, 0

        def get_max_length(self) -> int:
            return -1

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.slab_kt is not None and self.slab_v is not None:  # (both are allocated together)
                self.slab_kt, self.slab_v = self.slab_kt[indices], self.slab_v[indices]
                self.rows_held = len(indices)
                self._views()

        def keep_rows(self, order: list[int], n: int) -> None:
            """Keep the batch rows ``order`` (row ``order[j]`` becomes row ``j``) in the same slab,
            copying only its first ``n`` columns (the ones written so far).

            No new slab: a copy into fresh memory would make the kernel fault in and zero new pages
            at every compaction. A target row must be one whose own content has moved already or is
            dropped, a source one that is not written before it is read."""
            assert self.slab_kt is not None and self.slab_v is not None  # rows are kept after a prefill
            for j, b in enumerate(order):
                if j != b:
                    self.slab_kt[j, :, :, :n] = self.slab_kt[b, :, :, :n]
                    self.slab_v[j, :, :n] = self.slab_v[b, :, :n]
            self.slab_kt, self.slab_v = self.slab_kt[:len(order)], self.slab_v[:len(order)]
            self._views()

        def offload(self):
            pass

        def prefetch(self):
            pass

    return _SlabLayer


_CACHE_KW: dict[type, str] = {}


def base_model(model):
    """The transformers model under a PEFT wrapper (``model`` itself when it has none)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def cache_kw(model) -> str:
    """The forward argument that takes a key/value cache: ``cache`` in recent transformers, which warn on
    the older ``past_key_values`` (still the only name in older releases)."""
    kind = type(base_model(model))
    if kind not in _CACHE_KW:
        _CACHE_KW[kind] = "cache" if "cache" in inspect.signature(kind.forward).parameters else "past_key_values"
    return _CACHE_KW[kind]


def make_cache(layers: int, cap: int):
    from transformers.cache_utils import Cache

    cls = _slab_layer_class()
    return Cache(layers=[cls(cap) for _ in range(layers)])


def n_layers(model) -> int:
    cfg = model.config
    return int(getattr(cfg, "num_hidden_layers", None) or cfg.get_text_config().num_hidden_layers)


def decode_batch(model, tokenizer, prompts, sp: SamplingParams, eos_ids, pad_id, gen, reuse, keep_kv,
            min_shared: int = 32):
    """Batched sampling. ``reuse[i]`` is None or (cache entry, n): the first n prompt tokens of row i
    are taken from the entry. Returns completions and, per row, (ids covered, per-layer k/v of the
    ids after the shared prefix, the shared prefix's entry or None) if keep_kv. The slab's layout: :class:`_Plan`."""
    device = next(model.parameters()).device
    n = len(prompts)
    if min(len(p) for p in prompts) == 0:
        raise ValueError("empty prompt")
    g = _Plan.of(model, prompts, reuse, min_shared, device)
    reused_width, prompt_width, own, deltas, rows = g.reused_width, g.prompt_width, g.own, g.deltas, g.rows
    cap = reused_width + prompt_width + sp.max_new_tokens
    cache = make_cache(n_layers(model), cap)
    ids, pos, att = _slab_inputs(deltas, g.cached, own, reused_width, prompt_width, cap, pad_id, device)
    if reused_width > 0:
        _fill_reused(cache, reuse, rows, own, g.cached, deltas, reused_width, prompt_width, g.n_shared, device)
    eos_t = torch.tensor(eos_ids, device=device)
    out_ids: list[list[int]] = [[] for _ in range(n)]
    out_lp: list[list[float]] = [[] for _ in range(n)]
    reasons = ["length"] * n
    kv: list[Any] = [None] * n
    done = [False] * n      # per batch row: finished, waiting to be dropped at the next compaction
    cur = reused_width + prompt_width
    r = torch.tensor(rows, device=device)
    logits = _prefill(model, cache, rows, deltas, r, ids, att, pos, prompt_width, cur, g.prefix)
    restartable = sp.restart_fn is not None and sp.max_restarts > 0
    first_logits = logits[g.expand] if restartable else None  # by original row
    batch = list(range(n))  # original row index of each batch row
    if len(rows) < n:  # copies of a deduplicated prompt get their own cache rows
        cache.batch_select_indices(g.expand)
        logits = logits[g.expand]
    else:  # the batch keeps the slab's order (by prefill length): no copy of the cache
        batch, att, pos = list(rows), att[r], pos[r]
    next_pos = pos[:, -1] + 1
    restarts, dropped = [0] * n, [0] * n
    discarded: list[list[str]] = [[] for _ in range(n)]
    ends = [cur] * n  # the slab column where each row's cache ends (all but its last sampled token)

    def keep_rows(bs: list[int], copy: bool) -> None:
        """Batch rows ``bs``' caches for their sessions: the ids they cover (all but the last sampled token),
        their key/values at the slab columns that hold their tokens after the shared prefix."""
        for b in bs:
            o = batch[b]
            spans = [(x, y) for x, y in ((reused_width - own[o], reused_width),
                                         (reused_width + prompt_width - len(deltas[o]), ends[o])) if y > x]
            kv[o] = (list(prompts[o]) + out_ids[o][:-1], _row_kv(cache, att, b, spans, restarts[o] > 0, copy), g.root)
    for step in range(sp.max_new_tokens):
        tok, lp = _sample(logits.float(), sp, gen)
        tok_l, lp_l = tok.tolist(), lp.tolist()
        finished = torch.isin(tok, eos_t).tolist()
        last = step == sp.max_new_tokens - 1
        for b, orig in enumerate(batch):
            if done[b]:
                continue
            out_ids[orig].append(tok_l[b])
            out_lp[orig].append(lp_l[b])
            event, text = _row_event(sp, tokenizer, out_ids[orig], finished[b], last,
                                     restartable and restarts[orig] < sp.max_restarts)
            if event == "restart":
                # start this row over from its prompt: mask out what it generated, sample a new first token
                assert first_logits is not None  # kept for a restartable call
                discarded[orig].append(text)
                dropped[orig] += len(out_ids[orig])
                restarts[orig] += 1
                t0, l0 = _sample(first_logits[orig:orig + 1].float(), sp, gen)
                tok[b], out_ids[orig], out_lp[orig] = t0[0], [int(t0[0])], [float(l0[0])]
                att[b, reused_width + prompt_width:cur] = 0
                next_pos[b] = len(prompts[orig])
                continue
            if event is None:
                continue
            if event != "length":
                reasons[orig] = event
            done[b], ends[orig] = True, cur
        n_done = sum(done)
        if n_done == len(batch):
            break
        # finished rows leave the batch at once: the live rows past the first k fill the holes among
        # them, one row copy per hole (about what a finished row would cost in one more step)
        if n_done:
            if keep_kv:  # the finished rows leave the slab: copy what their caches cover
                keep_rows([b for b in range(len(batch)) if done[b]], True)
            order = _compaction(done)
            for layer in cache.layers:
                layer.keep_rows(order, cur)
            kt = torch.tensor(order, device=device)
            att, tok, next_pos = att[kt], tok[kt], next_pos[kt]
            batch, done = [batch[b] for b in order], [False] * len(order)
        att[:, cur] = 1
        cur += 1
        logits = model(input_ids=tok[:, None], attention_mask=att[:, :cur], position_ids=next_pos[:, None],
                       **{cache_kw(model): cache}, use_cache=True, logits_to_keep=1, **g.prefix).logits[:, -1, :]
        next_pos = next_pos + 1
    if keep_kv:  # the rows still in the slab keep views of it (the slab lives as long as their sessions),
        # or copies where they fill less than half of it (compaction leaves the slab its first size)
        keep_rows(list(range(len(batch))), 2 * len(batch) <= cache.layers[0].rows_held)
    outs = [Completion(text=tokenizer.decode(out_ids[i], skip_special_tokens=True), token_ids=out_ids[i],
                       logprobs=out_lp[i], finish_reason=reasons[i], discarded=discarded[i],
                       discarded_tokens=dropped[i]) for i in range(n)]
    return outs, kv


def _shared_prefix(model, reuse, cached: list[int], min_shared: int):
    """A prefix held once for all rows (every row reuses a cache with the same root entry, at least
    ``min_shared`` tokens of it): (root entry, its length n_shared, the attention's ``scope_prefix`` argument), or
    (None, 0, {})."""
    root, n_shared = None, 0
    if len(reuse) > 1 and all(r is not None for r in reuse) and model.config._attn_implementation == _attention.NAME:
        root = reuse[0][0].root
        if all(r[0].root is root for r in reuse):
            n_shared = min(min(cached), len(root.ids))
        if n_shared < min_shared:
            root, n_shared = None, 0
    prefix = ({"scope_prefix": [_joined(root.pieces(li, 0, n_shared)) for li in range(len(root.layers))]}
              if n_shared and root is not None else {})
    # a row diverges inside the shared entry: the sessions share its first n_shared tokens
    if n_shared and root is not None and n_shared < len(root.ids):
        root = KVEntry(root.ids[:n_shared], [[kv] for kv in prefix["scope_prefix"]], root.adapter, root.version)
    return root, n_shared, prefix


def _fill_reused(cache, reuse, rows, own, cached, deltas, reused_width: int, prompt_width: int, n_shared: int,
                 device) -> None:
    """Each slab row's reused key/values (after the shared prefix), right-aligned at column reused_width."""
    ex = next(r[0] for r in reuse if r is not None).root
    for li, layer in enumerate(cache.layers):
        kt0 = ex.layers[li][0][0]
        layer._alloc(len(rows), kt0.shape[0], kt0.shape[1], kt0.dtype, device, zero=False)
        for j, i in enumerate(rows):
            # zeros in the gaps only: the reused tokens, the prompt rest and the sampled tokens
            # are written before they are read (the columns past them are never read)
            for x, y in ((0, reused_width - own[i]), (reused_width, reused_width + prompt_width - len(deltas[i]))):
                if y > x:
                    layer.slab_kt[j, :, :, x:y] = 0
                    layer.slab_v[j, :, x:y] = 0
            if reuse[i] is not None:
                at = reused_width - own[i]
                for kt, v in reuse[i][0].pieces(li, n_shared, cached[i]):
                    layer.slab_kt[j, :, :, at:at + kt.shape[-1]] = kt
                    layer.slab_v[j, :, at:at + kt.shape[-1]] = v
                    at += kt.shape[-1]
        layer.n = reused_width
        layer._views()


def _prefill(model, cache, rows, deltas, r, ids, att, pos, prompt_width: int, cur: int, prefix):
    """The prompts' last logits, one per slab row. The prefill goes in chunks of rows (about
    PREFILL_CHUNK_TOKENS tokens each): on the CPU one huge forward is slower, its activations no longer fit
    in the caches. A chunk covers only the last w slab positions before ``cur`` (= reused_width + prompt_width),
    w being its longest delta (the rest is masked padding)."""
    parts, s0 = [], 0
    while s0 < len(rows):
        s1 = s0 + 1
        while s1 < len(rows) and (s1 + 1 - s0) * len(deltas[rows[s1]]) <= PREFILL_CHUNK_TOKENS:
            s1 += 1
        rr, w = r[s0:s1], len(deltas[rows[s1 - 1]])
        for layer in cache.layers:
            layer.total_rows, layer.rows, layer.n = len(rows), slice(s0, s1), cur - w
            if layer.slab_kt is not None:
                layer._views()
        parts.append(model(input_ids=ids[rr, prompt_width - w:], attention_mask=att[rr, :cur],
                           position_ids=pos[rr, prompt_width - w:],
                           **{cache_kw(model): cache}, use_cache=True, logits_to_keep=1, **prefix).logits[:, -1, :])
        s0 = s1
    for layer in cache.layers:
        layer.rows, layer.n = slice(None), cur
        layer._views()
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _compaction(done: list[bool]) -> list[int]:
    """The batch rows to keep, in their new order: the live rows past the first k (k = live rows) fill the
    holes the finished rows leave among the first k, one row copy per hole."""
    k = len(done) - sum(done)
    holes = [j for j in range(k) if done[j]]                     # finished rows among the first k
    movers = [b for b in range(k, len(done)) if not done[b]]    # live rows after them, as many
    order = list(range(k))
    for h, m in zip(holes, movers):
        order[h] = m
    return order


@dataclass
class _Plan:
    """Where each row's tokens go in the slab. When every row's cache starts with the same shared entry
    (``KVEntry.shared``), its first ``n_shared`` tokens stay out of the slab: the attention gets them once for all
    rows (``attention.py``, through ``prefix``). Each row in the slab: [reused tokens after n_shared, right-aligned
    at reused_width][prompt rest, right-aligned at reused_width + prompt_width][sampled tokens]; the gaps are masked
    out and position ids count all real tokens (n_shared included). Rows with the same prompt and cached prefix
    share one slab row (``uniq``, ``expand``); slab rows go in order of the length to prefill, so that each
    prefill chunk is padded only to its own longest."""
    cached: list[int]     # per row: prompt tokens taken from its cache entry
    root: Any             # the shared entry (or None)
    n_shared: int
    prefix: dict[str, Any]
    own: list[int]        # per row: reused tokens that go into its slab row
    reused_width: int
    deltas: list[Any]     # per row: the prompt tokens to prefill
    prompt_width: int
    rows: list[int]       # the slab's rows (a first row of each set of same rows), by prefill length
    expand: torch.Tensor  # per row: its slab row

    @classmethod
    def of(cls, model, prompts, reuse, min_shared: int, device) -> "_Plan":
        uniq = _first_of_same(prompts, reuse)
        cached = [r[1] if r else 0 for r in reuse]
        root, n_shared, prefix = _shared_prefix(model, reuse, cached, min_shared)
        own = [c - n_shared for c in cached]
        deltas = [p[c:] for p, c in zip(prompts, cached)]
        rows = sorted(set(uniq), key=lambda i: (len(deltas[i]), i))
        row_of = {r: j for j, r in enumerate(rows)}
        return cls(cached, root, n_shared, prefix, own, max(own), deltas, max(len(d) for d in deltas), rows,
                   torch.tensor([row_of[u] for u in uniq], device=device))


def _first_of_same(prompts, reuse) -> list[int]:
    """Per row, the first row with the same prompt and the same cached prefix: such rows are prefilled once
    and their key/values copied."""
    keys = [(tuple(p), id(r[0]) if r else None, r[1] if r else 0) for p, r in zip(prompts, reuse)]
    first: dict[Any, int] = {}
    return [first.setdefault(k, i) for i, k in enumerate(keys)]


def _slab_inputs(deltas, cached, own, reused_width: int, prompt_width: int, cap: int, pad_id: int, device):
    """The prefill's input ids and position ids (each row's prompt rest, right-aligned at reused_width +
    prompt_width) and the attention mask over the slab's columns (its reused tokens before reused_width, its prompt
    rest before reused_width + prompt_width)."""
    n = len(deltas)
    att = torch.zeros((n, cap), dtype=torch.long, device=device)
    ids = torch.full((n, prompt_width), pad_id, dtype=torch.long)
    pos = torch.zeros((n, prompt_width), dtype=torch.long)
    for i, d in enumerate(deltas):
        ids[i, prompt_width - len(d):] = torch.tensor(d, dtype=torch.long)
        pos[i, prompt_width - len(d):] = torch.arange(cached[i], cached[i] + len(d))
        att[i, reused_width - own[i]:reused_width] = 1
        att[i, reused_width + prompt_width - len(d):reused_width + prompt_width] = 1
    return ids.to(device), pos.to(device), att


def _row_event(sp: SamplingParams, tokenizer, ids: list[int], finished: bool, last: bool,
               may_restart: bool) -> tuple[str | None, str]:
    """What a row's newest token means, and the text so far (decoded once per step, only for the callbacks
    that look at it): "eos", "stop" (a stop string, or ``stop_fn``), "restart" (``restart_fn`` asks to start
    over; never at the last step), "length" (the last step) or None (go on)."""
    text = (tokenizer.decode(ids, skip_special_tokens=True)
            if (may_restart or sp.stop_fn is not None) and not finished else "")
    if finished:
        return "eos", text
    # a stop string is looked for in the last tokens' text only (8 tokens more than the longest stop string)
    if sp.stop and any(s in tokenizer.decode(ids[-(max(len(x) for x in sp.stop) + 8):]) for s in sp.stop):
        return "stop", text
    if may_restart and sp.restart_fn is not None and not last and sp.restart_fn(text):
        return "restart", text
    if sp.stop_fn is not None and sp.stop_fn(text):
        return "stop", text
    return ("length" if last else None), text


def _row_kv(cache, att, b: int, spans, restarted: bool, copy: bool):
    """Per layer, the (transposed keys, values) pieces of batch row ``b``: views of the slab at the
    given column spans, or one copy (``copy``; always for a restarted row, whose masked-out attempts
    leave holes)."""
    if restarted:
        real = att[b, :spans[-1][1]].nonzero()[:, 0]
        return [[(layer.slab_kt[b][:, :, real], layer.slab_v[b][:, real])] for layer in cache.layers]
    out = []
    for layer in cache.layers:
        ps = [(layer.slab_kt[b, :, :, x:y], layer.slab_v[b, :, x:y]) for x, y in spans]
        if copy:
            ps = [_joined(ps)] if len(ps) > 1 else [(ps[0][0].clone(), ps[0][1].clone())]
        out.append(ps)
    return out


def _joined(pieces):
    """One (transposed keys, values) pair from consecutive pieces (a single piece is returned as is)."""
    if len(pieces) == 1:
        return pieces[0]
    return torch.cat([k for k, _ in pieces], dim=-1), torch.cat([v for _, v in pieces], dim=1)


def _sample(logits: torch.Tensor, sp: SamplingParams, gen: torch.Generator):
    """Sample a token per row; return it and its log-prob under logits / temperature."""
    if sp.temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logp.argmax(-1)
        return tok, logp.gather(-1, tok[:, None])[:, 0]
    if sp.top_p >= 1.0:  # one pass fewer over the vocabulary: the draw's cumulative sum also normalises
        z = logits / sp.temperature
        m = z.amax(-1, keepdim=True)
        cum = z.sub(m).exp_().cumsum_(-1)
        u = torch.rand((z.shape[0], 1), generator=gen, device=z.device) * cum[:, -1:]
        tok = torch.searchsorted(cum, u)[:, 0].clamp_(max=z.shape[-1] - 1)
        return tok, (z.gather(-1, tok[:, None]) - m - cum[:, -1:].log())[:, 0]
    logp = torch.log_softmax(logits / sp.temperature, dim=-1)
    sorted_p, order = logp.exp().sort(dim=-1, descending=True)
    sorted_p = sorted_p.masked_fill((sorted_p.cumsum(-1) - sorted_p) > sp.top_p, 0.0)
    tok = order.gather(-1, _inverse_cdf(sorted_p, gen)[:, None])[:, 0]
    return tok, logp.gather(-1, tok[:, None])[:, 0]


def _inverse_cdf(weights: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One draw per row proportional to ``weights`` (much cheaper than torch.multinomial on CPU)."""
    cum = weights.cumsum(-1)
    u = torch.rand((weights.shape[0], 1), generator=gen, device=weights.device) * cum[:, -1:]
    return torch.searchsorted(cum, u)[:, 0].clamp(max=weights.shape[-1] - 1)
