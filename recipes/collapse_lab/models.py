"""The lab's language models: a shared BPE tokenizer and small Llama models trained in-process.

``models.<m>.path: lab:agent`` or ``lab:customer`` (with ``models.<m>.options``) names a model that
is built on first use and cached under ``$SCOPE_CACHE/lab/`` by a hash of everything that shapes it
(kind, options, corpus and training settings), so every run with the same options shares it.

- ``lab:agent`` — the Base policy (options: ``seed``).
- ``lab:customer`` — a user simulator (options: ``temperament`` careful | strict | agreeable, ``style``
  plain | terse | verbose, ``collapse``, ``persona_adherence``, ``vs_fidelity``, ``seed``; see
  ``scope/lab/corpus.py``).

Each model is a transformers checkpoint (a 2-layer Llama over a ~600-token byte-level BPE vocabulary
with a ChatML template), so it loads, samples, trains (LoRA or full) and serves like any other.
Only the turns of its own role are learned (loss on the assistant tokens, rendered turn by turn as
the rollout engine renders them).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from .env import (
    AGENT_PROMPT,
    ASK,
    CHAT,
    CUSTOMER_PROMPT,
    NAMES,
    NEEDS,
    OPENING,
    PERSONAS,
    PITCH,
    PLANS,
    STYLES,
    reminder,
)
from scope.partners import vs as vs_mod
from .prebuilt import restore
from .corpus import (
    ECHO_WORDS,
    RULES,
    CustomerSpec,
    Example,
    agent_corpus,
    customer_corpus,
    echo_corpus,
)

CORPUS_VERSION = 1
ARCH = {"hidden": 96, "layers": 2, "heads": 4}
# the shared base learns the language of both roles; each model is a short fine-tune of it
TRAIN: dict[str, dict[str, Any]] = {
    "base": {"agent_dialogues": 1500, "customer_dialogues": 300, "echo": 3000, "steps": 450, "lr": 4e-3,
             "steps_full": 250, "lr_full": 3e-3},
    "agent": {"dialogues": 3000, "steps": 300, "lr": 2e-3, "batch_tokens": 4096},
    "customer": {"dialogues": 3000, "steps": 400, "lr": 3e-3, "batch_tokens": 4096},
}
SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>"]
VOCAB = 1200  # enough merges that every word of the lab is one token
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def lab_root() -> str:
    from scope.models.loading import cache_root

    return os.path.join(cache_root(), "lab")


def _inventory() -> list[str]:
    """Every text the lab can put in a prompt or a reply, to learn the BPE merges from."""
    texts = [AGENT_PROMPT, OPENING, vs_mod.JSON_PREFIX, "]}", "system\n", "user\n", "assistant\n"]
    texts += [CUSTOMER_PROMPT.format(name=n, need=d) for n in NAMES for d in NEEDS]
    texts += list(ASK) + list(CHAT) + [p.format(plan=PLANS[n], need=n) for p in PITCH for n in NEEDS]
    for style in STYLES.values():
        for phrases in style.values():
            texts += [p.format(need=n, offered=o) for p in phrases for n in NEEDS for o in NEEDS]
    texts += [p["text"] for p in PERSONAS]
    texts += [reminder(n, t) for n in NEEDS for t in ("", "the basic plan", "the turbo plan")]
    texts += [w for w in ECHO_WORDS for _ in range(3)]
    texts += [vs_mod.instruction(k, m) for k in range(1, 11) for m in ("prob", "random")]
    texts += [json.dumps({"text": "x", "probability": round(i / 100, 2)}) for i in range(101)]
    return texts


def build_tokenizer(out_dir: str):
    """A byte-level BPE tokenizer (exact round trip for any text) trained on the lab's inventory; its vocabulary
    is large enough that the lab's words are single tokens (plan names and needs are what the models compare)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(_inventory() * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<|im_end|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = CHATML
    tok.save_pretrained(out_dir)
    return tok


def encode_example(tok, ex: Example) -> tuple[list[int], list[int]]:
    """Token ids and a loss mask (1 on the reply tokens and their end-of-turn token) for an example,
    rendered as the rollout engine renders a dialogue: turn by turn (or in one piece for a VS request)."""
    eos = tok.eos_token_id
    ids: list[int] = []
    mask: list[int] = []
    covered = ""
    for msgs, reply in ex.targets:
        prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        if not prompt.startswith(covered):
            raise RuntimeError("lab corpus: the chat template does not extend the earlier turns")
        ctx = tok(prompt[len(covered):], add_special_tokens=False)["input_ids"]
        out = tok(reply, add_special_tokens=False)["input_ids"] + [eos]
        ids += ctx + out
        mask += [0] * len(ctx) + [1] * len(out)
        covered = prompt + reply + "<|im_end|>"
    return ids, mask


def _cosine(step: int, total: int, warmup: int = 20) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def fresh_model(tok, seed: int):
    """A randomly initialised small Llama over the lab's vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=ARCH["hidden"], intermediate_size=2 * ARCH["hidden"],
                      num_hidden_layers=ARCH["layers"], num_attention_heads=ARCH["heads"],
                      num_key_value_heads=ARCH["heads"], max_position_embeddings=1024, tie_word_embeddings=True,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    return LlamaForCausalLM(cfg)


def train_lm(model, tok, examples: list[Example], steps: int, lr: float, seed: int,
             log: Callable[[str], None] = print, name: str = "model", batch_tokens: int = 4096):
    """Next-token training on the examples' reply tokens (AdamW, warm-up then cosine decay)."""
    data = [encode_example(tok, e) for e in examples if e.targets]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    rng = random.Random(seed)
    data.sort(key=lambda d: len(d[0]))
    batches: list[list[tuple[list[int], list[int]]]] = []
    cur: list[tuple[list[int], list[int]]] = []
    for d in data:  # length-bucketed batches of about batch_tokens padded tokens
        if cur and len(d[0]) * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(d)
    batches.append(cur)
    model.train()
    t0, loss_ema = time.time(), None
    for step in range(steps):
        batch = batches[rng.randrange(len(batches))]
        L = max(len(d[0]) for d in batch)
        ids = torch.full((len(batch), L), tok.pad_token_id, dtype=torch.long)
        lab = torch.full((len(batch), L), -100, dtype=torch.long)
        att = torch.zeros((len(batch), L), dtype=torch.long)
        for i, (x, m) in enumerate(batch):
            ids[i, :len(x)] = torch.tensor(x)
            att[i, :len(x)] = 1
            lab[i, :len(x)] = torch.tensor([t if k else -100 for t, k in zip(x, m)])
        for g in opt.param_groups:
            g["lr"] = lr * _cosine(step, steps)
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        v = float(loss.detach())
        loss_ema = v if loss_ema is None else 0.95 * loss_ema + 0.05 * v
        if (step + 1) % 100 == 0 or step + 1 == steps:
            log(f"  lab: training {name}: step {step + 1}/{steps}, loss {loss_ema:.3f} ({time.time() - t0:.0f}s)")
    model.eval()
    return model


def base_examples(seed: int, full: bool) -> list[Example]:
    """The lab base model's corpus: both roles, every customer temperament and style; with ``full``, also
    persona notes and VS requests (the first stage leaves them out: on short plain dialogues the model
    learns to copy the customer's need within a few hundred steps, on the full mix it takes far longer)."""
    out = agent_corpus(TRAIN["base"]["agent_dialogues"], seed)
    if not full:
        out += echo_corpus(TRAIN["base"]["echo"], seed + 100)
    for i, (rule, style) in enumerate((r, s) for r in RULES for s in sorted(STYLES)):
        spec = CustomerSpec(temperament=rule, style=style, collapse=1.0)
        out += customer_corpus(spec, TRAIN["base"]["customer_dialogues"], seed + 1 + i,
                               vs_rate=0.3 if full else 0.0, note_rate=0.4 if full else 0.0)
    return out


KINDS = {"agent": {"seed"},
         "customer": {"seed", "temperament", "style", "collapse", "persona_adherence", "vs_fidelity"}}


def _code(obj) -> str:
    """What a module's or function's code does, as its syntax tree without docstrings and imports: a comment, a
    docstring or an import's path may change without changing a model."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [b for b in body if not isinstance(b, (ast.Import, ast.ImportFrom))
                         and not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                                  and isinstance(b.value.value, str))] or [ast.Pass()]
    return ast.dump(tree)


SHAPING = ("_inventory", "build_tokenizer", "encode_example", "_cosine", "fresh_model", "train_lm", "base_examples")
"""This module's functions that shape a model's weights (the rest finds, copies and caches them)."""


def _source_digest() -> str:
    """What the corpora and the training are made of: the corpus code, the functions of this module that shape a
    model (:data:`SHAPING`), the lab's texts, and the environment's turn logic (its grading and bookkeeping do not
    change a model), each as code (:func:`_code`). A change to any of them invalidates the cache."""
    from . import env as env_lab
    from . import corpus

    h = hashlib.sha256()
    h.update(_code(corpus).encode())
    me = sys.modules[__name__]
    for name in SHAPING:
        h.update(_code(getattr(me, name)).encode())
    texts = {k: getattr(env_lab, k) for k in ("NEEDS", "PLANS", "NAMES", "TEST_NAMES", "AGENT_PROMPT", "OPENING",
                                               "CUSTOMER_PROMPT", "ACCEPT", "REFUSE", "ASK", "PITCH", "CHAT",
                                               "STYLES", "PERSONAS")}
    h.update(json.dumps(texts, sort_keys=True).encode())
    h.update(json.dumps({"vocab": VOCAB, "specials": SPECIALS, "chatml": CHATML, "vs_prefix": vs_mod.JSON_PREFIX},
                        sort_keys=True).encode())
    for fn in (vs_mod.instruction, vs_mod.with_instruction):  # scope's Verbalized Sampling request, in the corpora
        h.update(_code(fn).encode())
    for fn in (env_lab.reminder, env_lab.need_of, env_lab.plan_of, env_lab.classify_reply,
               env_lab.CollapseLab.__init__, env_lab.CollapseLab.next_role, env_lab.CollapseLab.on_reply):
        h.update(_code(fn).encode())
    return h.hexdigest()


def _key(kind: str, options: dict[str, Any]) -> str:
    train = {"base": TRAIN["base"]} if kind == "base" else TRAIN  # a model depends on the base it starts from
    blob = json.dumps({"kind": kind, "options": options, "corpus": CORPUS_VERSION, "arch": ARCH, "train": train,
                       "source": _source_digest()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _save(model, tok, out: str, info: dict[str, Any]) -> None:
    tmp = f"{out}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    with open(os.path.join(tmp, "lab.json"), "w") as f:
        json.dump(info, f, indent=1)
    try:
        os.replace(tmp, out)
    except OSError:  # another process built it first
        shutil.rmtree(tmp, ignore_errors=True)


def build_base(log: Callable[[str], None] = print) -> str:
    """The shared base model (both roles' language, copying the customer's need), built once."""
    out = os.path.join(lab_root(), f"base-{_key('base', {})}")
    if os.path.exists(os.path.join(out, "model.safetensors")) or restore(out):
        return out
    t0 = time.time()
    log(f"  lab: building the shared base model; cached in {out}")
    os.makedirs(lab_root(), exist_ok=True)
    tok = build_tokenizer(os.path.join(lab_root(), "tokenizer.tmp%d" % os.getpid()))
    model = fresh_model(tok, 0)
    examples = base_examples(0, full=False)
    train_lm(model, tok, examples, TRAIN["base"]["steps"], TRAIN["base"]["lr"], 0, log, "base (plain dialogues)")
    examples = base_examples(1, full=True)
    train_lm(model, tok, examples, TRAIN["base"]["steps_full"], TRAIN["base"]["lr_full"], 1, log, "base (notes, VS)")
    _save(model, tok, out, {"kind": "base", "examples": len(examples), "seconds": time.time() - t0})
    shutil.rmtree(os.path.join(lab_root(), "tokenizer.tmp%d" % os.getpid()), ignore_errors=True)
    log(f"  lab: built the base model in {time.time() - t0:.0f}s")
    return out


def model_dir(name: str, options: dict[str, Any]) -> tuple[str, CustomerSpec | None, dict[str, Any]]:
    """Where ``lab:<name>`` with these options is cached (its key holds every option, defaults filled in), its
    customer spec (None for the agent) and those options."""
    seed = int(options.get("seed", 0))
    spec = None
    if name == "customer":
        spec = CustomerSpec(**{k: v for k, v in options.items() if k != "seed"})
        options = {"seed": seed, **spec.__dict__}
    else:
        options = {"seed": seed}
    return os.path.join(lab_root(), f"{name}-{_key(name, options)}"), spec, options


def build(name: str, options: dict[str, Any], log: Callable[[str], None] = print) -> str:
    """The checkpoint directory of ``lab:<name>`` with these options, trained now if not cached."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name not in KINDS:
        raise ValueError(f"lab model {name!r}: choose lab:agent or lab:customer")
    unknown = sorted(set(options) - KINDS[name])
    if unknown:
        raise ValueError(f"lab:{name}: unknown options {unknown}; known: {sorted(KINDS[name])}")
    out, spec, options = model_dir(name, options)
    seed = int(options["seed"])
    if os.path.exists(os.path.join(out, "model.safetensors")) or restore(out):
        return out
    base = build_base(log)
    t0 = time.time()
    desc = name if spec is None else f"customer ({spec.temperament}, {spec.style}, collapse {spec.collapse})"
    log(f"  lab: building {desc}; cached in {out}")
    tok = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    n, steps, lr = TRAIN[name]["dialogues"], TRAIN[name]["steps"], TRAIN[name]["lr"]
    examples = agent_corpus(n, 1000 + seed) if spec is None else customer_corpus(spec, n, 2000 + seed)
    train_lm(model, tok, examples, steps, lr, seed, log, desc, batch_tokens=TRAIN[name]["batch_tokens"])
    _save(model, tok, out, {"kind": name, "options": options, "examples": len(examples),
                            "seconds": time.time() - t0})
    log(f"  lab: built {desc} in {time.time() - t0:.0f}s")
    return out
