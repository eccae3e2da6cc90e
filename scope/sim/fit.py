"""``scope sim fit``: a user simulator fitted to people. Supervised LoRA fine-tuning of a model (default the
embedded SmolLM2) on the persuadee side of the real Persuasion for Good dialogues of the train persuadees.

What a persuadee is fitted to comes from ``examples``, an import path to a function of one real dialogue
(:class:`scope.data.p4g.HumanDialogue`) returning the chat views to fit on. The default,
``scope.envs.p4g:fit_views``, renders each dialogue as the P4G environment shows it to its persuadee (the persona
in the system prompt, the persuader's turns as user messages), its last turn ending with the ``[DONATE $N]``
marker of that participant's actual donation; an experiment supplies its own (its prompt, a forced decision).
The loss falls on the assistant's tokens only (each turn and its end-of-turn token, rendered turn by turn as the
rollout engine renders them). A view longer than ``max_tokens`` is cut into windows of whole turns, each with
the system prompt.

The output directory holds ``adapter/`` (a PEFT adapter: ``models.<m>.adapter``, a panel entry's
``adapter``, ``scope serve --adapter``) and ``fit.json`` (options, the hash of data and options, the
losses). A run is cached by that hash (a finished fit with the same hash is not run again), writes a
checkpoint every ``save_every`` steps and resumes from it.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from typing import Any, Callable

import torch
from pydantic import Field

from ..config import LoraConfig, Strict
from ..data.p4g import HumanDialogue, load_dialogues, resolve_data_dir, shard_users
from ..registry import load_function, load_path

Views = Callable[[HumanDialogue], list[list[dict[str, str]]]]
"""What a persuadee is fitted to: one real dialogue -> the chat views whose assistant turns are the targets."""

ADAPTER = "sim"
VERSION = 1  # bump when the example format changes: old fits are then no longer reused


class FitConfig(Strict):
    model: str = "smollm2-135m"
    data_dir: str | None = None
    """The P4G data directory (``full_info.csv``, ``full_dialog.csv``); default ``SCOPE_P4G_DATA``."""
    split_seed: int = 0
    test_fraction: float = Field(default=0.2, gt=0, lt=1)
    lora: LoraConfig = LoraConfig(top_layers=8)
    """The adapter (as a run's ``models.<name>.lora``); on the top 8 layers by default: the backward pass stops
    below them, which halves a step's cost on a CPU."""
    lr: float = Field(default=3e-4, gt=0)
    epochs: float = Field(default=1.0, gt=0)
    batch_tokens: int = Field(default=4096, ge=64)
    """Tokens (padded) per optimizer step, in micro-batches of at most ``max_tokens``."""
    max_tokens: int = Field(default=1024, ge=64)
    max_dialogues: int | None = Field(default=None, ge=1)
    """Fit on the first N train dialogues only (a quick fit)."""
    shard: str | None = None
    """``k/n``: fit on the k-th of n disjoint random parts of the train persuadees only (``shard_seed``; see
    ``scope.sim.data.shard_users``), e.g. four simulators on four disjoint quarters of the people."""
    shard_seed: int = 0
    examples: str = "scope.envs.p4g:fit_views"
    """``module:function`` of one real dialogue returning the chat views to fit on (:data:`Views`): the default is
    the P4G environment's persuadee view; an experiment names its own (another prompt, a forced decision)."""
    warmup_steps: int = Field(default=10, ge=0)
    save_every: int = Field(default=25, ge=1)
    seed: int = 0
    out: str = "runs/sim-p4g"


def encode_dialogue(tok, msgs: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Token ids and a loss mask (1 on each assistant turn's tokens and its end-of-turn token), rendered turn by
    turn as the rollout engine renders a dialogue (the template must extend the earlier turns)."""
    from ..rollout import encode, render

    eos = tok.eos_token_id
    ids: list[int] = []
    mask: list[int] = []
    covered = ""
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prompt = render(tok, msgs[:i], True)
        if not prompt.startswith(covered):
            raise RuntimeError("sim fit: the chat template does not extend the earlier turns")
        ctx = encode(tok, prompt[len(covered):])
        out = encode(tok, m["content"]) + [eos]
        ids += ctx + out
        mask += [0] * len(ctx) + [1] * len(out)
        covered = render(tok, msgs[:i + 1], False)
        if not covered.startswith(prompt + m["content"]):
            raise RuntimeError("sim fit: the chat template changes a finished turn")
        tail = covered[len(prompt) + len(m["content"]):]  # what follows the reply (end-of-turn and newline)
        extra = encode(tok, tail)
        if extra[:1] == [eos]:
            extra = extra[1:]
        ids += extra
        mask += [0] * len(extra)
    return ids, mask


def windows(tok, msgs: list[dict[str, str]], max_tokens: int) -> list[list[dict[str, str]]]:
    """The dialogue as pieces of whole (user, assistant) exchanges that fit ``max_tokens`` with the system
    prompt; a dialogue that fits is one piece. An exchange that alone is too long is left out."""
    system, rest = msgs[:1], msgs[1:]
    pairs = [rest[i:i + 2] for i in range(0, len(rest) - 1, 2)]
    out: list[list[dict[str, str]]] = []
    cur: list[dict[str, str]] = []
    for p in pairs:
        if len(encode_dialogue(tok, system + cur + p)[0]) <= max_tokens:
            cur = cur + p
            continue
        if cur:
            out.append(system + cur)
        cur = p if len(encode_dialogue(tok, system + p)[0]) <= max_tokens else []
    if cur:
        out.append(system + cur)
    return out


def examples(tok, dialogues: list[HumanDialogue], max_tokens: int,
             views: Views | None = None) -> list[tuple[list[int], list[int]]]:
    """Every view of each dialogue (``views``, default :data:`FitConfig.examples`'s) as windows of at most
    ``max_tokens``, each with its loss mask."""
    views = views or load_path(FitConfig().examples)
    out = []
    for d in dialogues:
        for view in views(d):
            for w in windows(tok, view, max_tokens):
                ids, mask = encode_dialogue(tok, w)
                if sum(mask):
                    out.append((ids, mask))
    return out


def load_views(path: str) -> Views:
    """The views function ``path`` names (``module:function``); one that does not load is a ``ValueError``."""
    return load_function(path, "sim fit: examples")


def data_hash(cfg: FitConfig) -> str:
    d = resolve_data_dir(cfg.data_dir)
    h = hashlib.sha256()
    for f in ("full_info.csv", "full_dialog.csv"):
        with open(os.path.join(d, f), "rb") as fh:
            h.update(hashlib.sha256(fh.read()).digest())
    opts = cfg.model_dump(exclude={"out", "data_dir", "save_every"})
    h.update(json.dumps({"options": opts, "version": VERSION}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def masked_nll(model, ids: torch.Tensor, att: torch.Tensor, sel: torch.Tensor,
               temperature: float = 1.0) -> torch.Tensor:
    """The negative log-likelihood of every selected token (position t-1 predicts token t) under softmax(logits /
    ``temperature``), memory-lean: the output layer is applied in chunks (the learner's own function)."""
    from ..learner import token_logprobs
    from ..models.decode import base_model

    base = base_model(model)
    hidden = base.get_decoder()(input_ids=ids, attention_mask=att).last_hidden_state
    h = hidden[:, :-1][sel[:, 1:]]
    logp, _ = token_logprobs(base.get_output_embeddings(), h, ids[sel], temperature)
    return -logp


def batch(items: list[tuple[list[int], list[int]]], pad: int):
    L = max(len(x) for x, _ in items)
    ids = torch.full((len(items), L), pad, dtype=torch.long)
    att = torch.zeros((len(items), L), dtype=torch.long)
    sel = torch.zeros((len(items), L), dtype=torch.bool)
    for i, (x, m) in enumerate(items):
        ids[i, :len(x)] = torch.tensor(x)
        att[i, :len(x)] = 1
        mm = torch.tensor(m, dtype=torch.bool)
        mm[0] = False
        sel[i, :len(x)] = mm
    return ids, att, sel


def micro_batches(data: list, max_tokens: int, rng: random.Random) -> list[list]:
    """Length-bucketed micro-batches of at most ``max_tokens`` padded tokens, in a shuffled order."""
    return [[data[i] for i in mb] for mb in micro_batch_indices(data, max_tokens, rng)]


def micro_batch_indices(data: list, max_tokens: int, rng: random.Random) -> list[list[int]]:
    """As :func:`micro_batches`, as indices into ``data`` (what a checkpoint keeps of an epoch's order)."""
    order = sorted(range(len(data)), key=lambda i: len(data[i][0]))
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and len(data[i][0]) * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def perplexity(backend, adapter: str | None, data: list[tuple[list[int], list[int]]], max_tokens: int,
               temperature: float = 1.0) -> float:
    """exp(mean NLL per persuadee token) of ``data`` under the base weights (None) or an adapter, sampled at
    ``temperature`` (the simulator as it plays: softmax(logits / temperature))."""
    if not data:
        raise ValueError("perplexity of no dialogue: no held-out example fits max_tokens")
    total, n = 0.0, 0
    with torch.no_grad(), backend.using(adapter) as model:
        for mb in micro_batches(data, max_tokens, random.Random(0)):
            ids, att, sel = batch(mb, backend.pad_id)
            nll = masked_nll(model, ids, att, sel, temperature=temperature)
            total += float(nll.sum())
            n += nll.numel()
    return math.exp(total / max(n, 1))


def fit(cfg: FitConfig, log: Callable[[str], None] = print, progress: bool = True) -> dict[str, Any]:
    """Fit (or reuse, or resume) the simulator; returns fit.json's content."""
    from ..models.loading import load_backend
    from ..run import publish_dir, save_weights

    views = load_views(cfg.examples)  # before anything is loaded: a bad path is the user's to fix
    key = data_hash(cfg)
    out = cfg.out
    meta_path = os.path.join(out, "fit.json")
    if os.path.exists(meta_path):
        meta = json.load(open(meta_path))
        if meta.get("hash") == key and meta.get("finished") and os.path.isdir(os.path.join(out, "adapter")):
            log(f"sim fit: {out} already holds this fit (hash {key}); nothing to do")
            return meta
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(cfg.seed)
    backend = load_backend(cfg.model, seed=cfg.seed)
    tok = backend.tokenizer
    dialogues = load_dialogues(cfg.data_dir, "train", cfg.split_seed, cfg.test_fraction)
    if cfg.shard:
        dialogues = shard_users(dialogues, cfg.shard, cfg.shard_seed)
    if cfg.max_dialogues:
        dialogues = dialogues[:cfg.max_dialogues]
    data = examples(tok, dialogues, cfg.max_tokens, views)
    if not data:
        raise ValueError(f"sim fit: no dialogue has an exchange that fits max_tokens={cfg.max_tokens} with its "
                         "system prompt; raise max_tokens")
    tokens = sum(len(x) for x, _ in data)
    per_step = max(1, cfg.batch_tokens // cfg.max_tokens)  # micro-batches per optimizer step
    rng = random.Random(cfg.seed)
    n_micro = len(micro_batch_indices(data, cfg.max_tokens, random.Random(0)))
    steps = max(1, math.ceil(n_micro * cfg.epochs / per_step))
    log(f"sim fit: {len(dialogues)} train dialogues -> {len(data)} examples, {tokens} tokens "
        f"({sum(sum(m) for _, m in data)} persuadee tokens); {steps} steps of {per_step} micro-batches; out {out}")
    backend.add_lora(ADAPTER, **cfg.lora.model_dump())
    params = backend.set_trainable(ADAPTER)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.0)
    start, losses, order = 0, [], []  # order: the micro-batches (indices) left of the current pass
    ck = os.path.join(out, "checkpoint")
    if os.path.exists(os.path.join(ck, "state.pt")):
        state = torch.load(os.path.join(ck, "state.pt"), weights_only=False)
        if state["hash"] == key:
            from peft import set_peft_model_state_dict
            from peft.utils import load_peft_weights

            from ..models.loading import adapter_dir

            set_peft_model_state_dict(backend.model, load_peft_weights(adapter_dir(os.path.join(ck, "adapter"))),
                                      adapter_name=ADAPTER)
            opt.load_state_dict(state["optimizer"])
            rng.setstate(state["rng"])
            start, losses, order = state["step"], state["losses"], state["order"]
            log(f"sim fit: resumed at step {start}")
    bar = _bar(steps, start, progress)
    t0 = time.time()
    for step in range(start, steps):
        lr = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup_steps)) * \
            0.5 * (1 + math.cos(math.pi * step / max(1, steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        backend.model.train()
        tot, n = 0.0, 0
        picks = []
        for _ in range(per_step):
            if not order:
                order = micro_batch_indices(data, cfg.max_tokens, rng)
            picks.append([data[i] for i in order.pop()])
        n_sel = sum(sum(m[1:]) for mb in picks for _, m in mb)
        with backend.using(ADAPTER) as model:
            for mb in picks:
                nll = masked_nll(model, *batch(mb, backend.pad_id))
                (nll.sum() / max(n_sel, 1)).backward()
                tot += float(nll.detach().sum())
                n += nll.numel()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        backend.model.eval()
        losses.append(tot / max(n, 1))
        bar(step + 1, losses[-1])
        if (step + 1) % cfg.save_every == 0 and step + 1 < steps:
            _checkpoint(backend, opt, rng, step + 1, losses, order, key, ck)
    bar(None, None)
    tmp = os.path.join(out, "adapter.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_weights(backend, ADAPTER, tmp)
    publish_dir(tmp, os.path.join(out, "adapter"))
    meta = {"hash": key, "finished": True, "options": cfg.model_dump(), "dialogues": len(dialogues),
            "examples": len(data), "tokens": tokens, "steps": steps, "losses": losses,
            "seconds": time.time() - t0}
    with open(meta_path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(meta_path + ".tmp", meta_path)
    shutil.rmtree(ck, ignore_errors=True)
    log(f"sim fit: wrote {out}/adapter ({steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
        f"{time.time() - t0:.0f}s)")
    return meta


def _checkpoint(backend, opt, rng, step: int, losses: list[float], order: list[list[int]], key: str, ck: str) -> None:
    from ..run import publish_dir, save_weights

    tmp = ck + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_weights(backend, ADAPTER, os.path.join(tmp, "adapter"))
    torch.save({"hash": key, "optimizer": opt.state_dict(), "rng": rng.getstate(), "step": step, "losses": losses,
                "order": order}, os.path.join(tmp, "state.pt"))
    publish_dir(tmp, ck)


def _bar(total: int, start: int, on: bool):
    """A progress bar (tqdm) over the optimizer steps; off: a line every tenth of the run."""
    if on:
        from tqdm import tqdm

        t = tqdm(total=total, initial=start, desc="sim fit", unit="step")

        def update(step, loss):
            if step is None:
                t.close()
                return
            t.update(1)
            t.set_postfix(loss=f"{loss:.3f}")
        return update

    def quiet(step, loss):
        if step is not None and (step % max(1, total // 10) == 0 or step == total):
            print(f"sim fit: step {step}/{total}, loss {loss:.3f}", flush=True)
    return quiet
