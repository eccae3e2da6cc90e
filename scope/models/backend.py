"""A local transformers model with LoRA adapters on one base: ``LocalBackend`` and the ``ModelRef`` handle.

One ``LocalBackend`` holds one base model and any number of named LoRA adapters. A ``ModelRef``
points at (backend, adapter); ``adapter=None`` means the base weights. Several roles (agent, frozen
partner, pool members) can therefore share one base in memory. Sampling runs in :mod:`.decode`.
"""
from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..types import Completion, Readout, ReadoutResult, SamplingParams
from . import attention as _attention
from .decode import KVEntry, base_model, cache_kw, common_prefix, decode_batch, make_cache, n_layers


def sliding_window(model) -> int | None:
    """The window of a model whose layers include sliding-window attention (Gemma 3: five in six), else None."""
    cfg = getattr(base_model(model), "config", None)
    kinds = getattr(cfg, "layer_types", None) or []
    window = getattr(cfg, "sliding_window", None)
    return int(window) if window and any("sliding" in str(k) for k in kinds) else None


class LocalBackend:
    def __init__(self, model: torch.nn.Module, tokenizer: Any, name: str = "local", seed: int = 0,
                 kv_budget_tokens: int = 100_000, pack_weights: bool = True):
        self.model: Any = model  # a transformers model, or PEFT's wrapper of one once it has adapters
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
        self.kv_store: OrderedDict[Any, KVEntry] = OrderedDict()
        self.kv_budget_tokens = kv_budget_tokens
        # a prefix shared by every row is attended whole by every query (a cascade), which a layer that sees only
        # its last window tokens must not: such a model keeps each row's own key/values only (_shared_min)
        self.window = sliding_window(model)
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
                 target_modules: Sequence[str] | str = "all-linear", layers: Sequence[int] | None = None,
                 top_layers: int | None = None) -> None:
        """Add a fresh LoRA adapter named ``name`` (B initialised to zero: it starts equal to the base);
        ``layers``: only these transformer layers, or ``top_layers``: only the top N (the backward pass then
        stops below the lowest)."""
        from peft import LoraConfig, get_peft_model

        if top_layers:
            n = self.model.config.num_hidden_layers
            layers = list(range(max(0, n - top_layers), n))
        if layers is not None and target_modules == "all-linear":  # PEFT wants the names with a layer subset
            target_modules = sorted({n.split(".")[-1] for n, m in self.model.named_modules()
                                     if isinstance(m, torch.nn.Linear) and "lm_head" not in n and "lora_" not in n})
        cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                         target_modules=list(target_modules) if not isinstance(target_modules, str)
                         else target_modules, task_type="CAUSAL_LM",
                         layers_to_transform=list(layers) if layers is not None else None)
        if not self.is_peft:
            with warnings.catch_warnings():  # PEFT reads transformers' deprecated is_gradient_checkpointing
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                self.model = get_peft_model(self.model, cfg, adapter_name=name)
        else:
            self.model.add_adapter(name, cfg)
        self.versions[name] = 0

    def lora_settings(self, name: str) -> dict[str, Any]:
        """Adapter ``name``'s settings as :meth:`add_lora` takes them (to build the same adapter elsewhere)."""
        return lora_settings(self.model.peft_config[name])

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
        reuse: list[tuple[KVEntry, int] | None] = []
        for i, p in enumerate(prompts):
            e = self.kv_store.get(sessions[i]) if sessions is not None and sessions[i] is not None else None
            n = (common_prefix(e.ids, p, len(p) - 1)
                 if e is not None and e.adapter == adapter and e.version == version else 0)
            reuse.append((e, n) if e is not None and n > 0 else None)
        with self.using(adapter) as model, self.packed.active(model):
            self._share_prefix(model, prompts, reuse)
            outs, kv = decode_batch(model, self.tokenizer, prompts, sampling, self.eos_ids, self.pad_id,
                               self.generator, reuse, keep_kv=sessions is not None,
                               min_shared=self._shared_min())
        mid = f"{self.name}:{adapter or 'base'}"
        for i, c in enumerate(outs):
            c.model_id, c.model_version = mid, version
            if sessions is not None and sessions[i] is not None:
                self.kv_store.pop(sessions[i], None)
                ids, layers, shared = kv[i]
                self.kv_store[sessions[i]] = KVEntry(ids, layers, adapter, version, shared)
        self._evict()
        return outs

    min_shared_prefix = 32  # tokens; a shorter common prefix is not worth its own forward pass

    def _shared_min(self) -> int:
        """The shortest common prefix the rows share as one block: none for a sliding-window model."""
        return sys.maxsize if self.window is not None else self.min_shared_prefix

    def readout(self, prompts: list[list[int]], sampling: SamplingParams, readout: Readout,
                adapter: str | None = None) -> list[ReadoutResult]:
        """The exact distribution over the decision each prompt's reply states (``Readout``), at the sampling
        temperature, and one reply sampled from it (:mod:`.readout`). Top-p is not applied: a readout with
        ``top_p < 1`` is an error."""
        from .readout import TokenClasses, readout as _readout

        if sampling.top_p < 1.0:
            raise ValueError(f"model {self.name!r}: a decision readout samples the full distribution; "
                             f"top_p={sampling.top_p} is not supported")
        if not prompts:
            return []
        if getattr(self, "_classes", None) is None:
            self._classes = TokenClasses(self.tokenizer, self.model.get_output_embeddings().weight.shape[0])
        version = self.versions.get(adapter, 0)
        shared, start, saves, weights = self._split_plan(adapter)
        with self.using(adapter) as model, self.packed.active(model):
            outs = _readout(model, self._classes, prompts, sampling.temperature, readout, self.generator,
                            self.pad_id, shared=shared, start=start, saves=saves, weights=weights)
        for r in outs:
            r.completion.model_id, r.completion.model_version = f"{self.name}:{adapter or 'base'}", version
        return outs

    share_readouts = True  # readouts under adapters on the top layers share the layers below (.readout.Shared)

    def _split_plan(self, adapter: str | None) -> tuple[Any, int, set[int], tuple]:
        """For a readout under ``adapter``: the backend's :class:`.readout.Shared` (None where nothing can be
        shared), the first layer the adapter changes (the layer count for the base: none), the layers whose
        entering states a read from the embeddings keeps for the other adapters (where one of them starts, at
        or below this one's start), and what identifies the base weights (each tensor's storage and in-place
        version)."""
        from .readout import Shared, splittable

        if not self.share_readouts:
            return None, 0, set(), ()
        if getattr(self, "_shared", None) is None:
            self._shared = Shared() if splittable(self.model) else False
        if not self._shared:
            return None, 0, set(), ()
        start = self._first_layer(adapter)
        saves = {k for a in ([None] + self.adapter_names() if self.is_peft else [None])
                 if 0 < (k := self._first_layer(a)) <= start}
        weights = tuple((p.data_ptr(), p._version) for name, p in self.model.named_parameters()
                        if "lora_" not in name)
        return (self._shared if start else None), start, saves, weights

    def _first_layer(self, adapter: str | None) -> int:
        """The lowest decoder layer that ``adapter`` has weights in (the layer count for the base)."""
        n = self.model.config.num_hidden_layers
        if adapter is None:
            return n
        key = (adapter, tuple(self.model.peft_config))
        cache = self.__dict__.setdefault("_first_layers", {})
        if key not in cache:
            firsts = [int(m.group(1)) for name, mod in self.model.named_modules()
                      if (m := re.search(r"\.layers\.(\d+)\.", name)) and adapter in getattr(mod, "lora_A", {})]
            cache[key] = min(firsts) if firsts else n
        return cache[key]

    def _share_prefix(self, model, prompts: list[list[int]], reuse: list) -> None:
        """Prefill the longest common prefix of the rows that have no cache once (in place on ``reuse``)."""
        fresh = [i for i, r in enumerate(reuse) if r is None]
        if len(fresh) < 2:
            return
        first = prompts[fresh[0]]
        n = min(len(prompts[i]) for i in fresh) - 1
        for i in fresh[1:]:
            n = common_prefix(first, prompts[i], n)
        if n < self._shared_min():
            return
        device = next(model.parameters()).device
        cache = make_cache(n_layers(model), n)
        model(input_ids=torch.tensor([first[:n]], device=device), **{cache_kw(model): cache}, use_cache=True,
              logits_to_keep=1)
        entry = KVEntry(list(first[:n]), [[(layer.slab_kt[0, :, :, :n], layer.slab_v[0, :, :n])]
                                           for layer in cache.layers],
                         None, -1)
        for i in fresh:
            reuse[i] = (entry, n)

    def _evict(self) -> None:
        total = sum(len(e.ids) for e in self.kv_store.values())
        while total > self.kv_budget_tokens and self.kv_store:
            _, e = self.kv_store.popitem(last=False)
            total -= len(e.ids)


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

    def readout(self, prompts: list[list[int]], sampling: SamplingParams, readout: Readout) -> list[ReadoutResult]:
        outs = self.backend.readout(prompts, sampling, readout, adapter=self.adapter)
        for r in outs:
            r.completion.model_id = self.id
        return outs


def lora_settings(pc: Any) -> dict[str, Any]:
    """A PEFT ``LoraConfig`` (an adapter in memory, or saved beside its weights) as :meth:`LocalBackend.add_lora`'s
    keyword arguments."""
    tm, layers = pc.target_modules, pc.layers_to_transform
    return {"r": pc.r, "alpha": pc.lora_alpha, "dropout": pc.lora_dropout,
            "target_modules": tm if isinstance(tm, str) else sorted(tm),
            "layers": [layers] if isinstance(layers, int) else (list(layers) if layers is not None else None)}
