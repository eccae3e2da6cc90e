"""Exact decision readouts on a local model: the distribution over what a reply decides, from the model's
next-token distributions (a few forward passes), and one reply sampled from those same distributions.

The prompts are prefilled together (their common prefix once, then each row's own part, right-padded);
then the tree of continuations is walked level by level for all rows at once: at each open node the
tokens whose text settles the decision are summed per decision, and the tokens that leave it open are
fed on together in one forward pass (each node's key/values taken once per open token). The walk stops at
``Readout.max_tokens``.
Which tokens settle what depends only on the text before them, so the tokens are sorted once per text
and kept (``TokenClasses``).

A panel reads the same prompts under several simulators that share one base model: adapters fitted on the
top layers only (``lora.top_layers``), or the base itself at another temperature. ``Shared`` keeps,
for the last chunks read, the decoder's hidden states at the layers where some adapter starts; a simulator
whose adapter leaves every layer below such a point as the base's takes them and runs only the layers above.
The layers below compute exactly what they would have (the same weights, inputs and shapes), so a readout
gives the same numbers, to the bit, with or without it (``tests/test_readout.py``).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import torch

from ..types import Completion, Readout, ReadoutResult
from .decode import base_model


class TokenClasses:
    """Per backend: each token's text, and for each (readout, text so far, final) the token ids grouped by
    the decision they settle, plus the ids that leave it open."""

    def __init__(self, tokenizer, vocab: int):
        n = len(tokenizer)
        self.texts = [tokenizer.decode([i]) if i < n else "\x00" for i in range(vocab)]
        self.cache: dict[tuple, tuple[dict[Any, torch.Tensor], torch.Tensor]] = {}

    def of(self, readout: Readout, before: str, final: bool):
        key = (readout.outcome, before, final)
        if key not in self.cache:
            groups: dict[Any, list[int]] = {}
            open_: list[int] = []
            for i, t in enumerate(self.texts):
                o = readout.outcome(before + t, final)
                if o is None:
                    if final:
                        raise ValueError(f"readout: outcome({before + t!r}, final=True) returned None")
                    open_.append(i)
                else:
                    groups.setdefault(o, []).append(i)
            self.cache[key] = ({o: torch.tensor(ids) for o, ids in groups.items()},
                               torch.tensor(open_, dtype=torch.long))
        return self.cache[key]


def _parts(model):
    base = base_model(model)
    return base.get_decoder(), base.get_output_embeddings()


def _run(model, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache, last: torch.Tensor,
         split: _Split | None = None, step: int = 0):
    """One forward pass of the decoder over ``ids`` [B, q] on top of ``cache`` (``mask``: [B, cached + q], the
    real tokens, or a boolean [B, 1, q, cached + q] of what each query attends to); the output layer is
    applied only at each row's positions ``last`` [B, j]. Returns (logits [B, j, vocab], the new cache).
    With ``split``, the chunk's pass number ``step`` runs layer by layer (``_layers``)."""
    from .decode import cache_kw

    dec, head = _parts(model)
    if split is not None:
        h, new = _layers(dec, ids, mask, positions, cache, split, step)
        h = dec.norm(h)[torch.arange(ids.shape[0], device=ids.device)[:, None], last]
        return head(h), new
    kw = {cache_kw(model): cache} if cache is not None else {}
    out = dec(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **kw)
    h = out.last_hidden_state[torch.arange(ids.shape[0], device=ids.device)[:, None], last]
    new = out.cache if "cache" in out else out.past_key_values
    return head(h), new


def _layers(dec, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache, split: _Split,
            step: int):
    """Llama's decoder forward, written out (the same operations in the same order), before its final norm;
    from ``split.start`` on the states saved for this pass, or from the embeddings, saving the states that
    enter each layer of ``split.saves``. Returns (hidden states, cache)."""
    from transformers import DynamicCache
    from transformers.masking_utils import create_causal_mask

    if cache is None:
        cache = DynamicCache(config=dec.config)
    n_layers = dec.config.num_hidden_layers
    if split.start > 0:
        rec = split.entry[step]
        h, causal, rope = rec[split.start], rec["mask"], rec["rope"]
    else:
        h = dec.embed_tokens(ids)
        causal = create_causal_mask(config=dec.config, inputs_embeds=h, attention_mask=mask, cache=cache,
                                    position_ids=positions)
        rope = dec.rotary_emb(h, position_ids=positions)
        rec = split.entry[step] = {"mask": causal, "rope": rope}
    for i in range(split.start, n_layers):
        if split.start == 0 and i in split.saves:
            rec[i] = h
        h = dec.layers[i](h, attention_mask=causal, position_embeddings=rope, position_ids=positions, cache=cache,
                          use_cache=True)
    if split.start == 0 and n_layers in split.saves:
        rec[n_layers] = h
    return h, cache


def select_cache_rows(model, cache, rows: torch.Tensor):
    """A new cache holding the given rows of ``cache`` (a row may be taken several times; layers a split pass
    did not run stay empty)."""
    from transformers import DynamicCache

    c = DynamicCache(config=model.config)
    for li, layer in enumerate(cache.layers):
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            c.update(layer.keys.index_select(0, rows), layer.values.index_select(0, rows), li)
    return c


class Shared:
    """Per backend: for the last ``keep`` chunks of prompts read, the decoder's hidden states entering chosen
    layers of each forward pass (with the pass's attention mask and rotary embeddings), valid while the
    base weights stay as they were."""

    def __init__(self, keep: int = 8):
        self.keep = keep
        self.entries: OrderedDict[tuple, dict[int, dict]] = OrderedDict()
        self.hits = 0  # chunks read from saved states

    def get(self, key: tuple, layer: int) -> dict[int, dict] | None:
        e = self.entries.get(key)
        if e is None or any(layer not in rec for rec in e.values()):
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return e

    def put(self, key: tuple, entry: dict[int, dict]) -> None:
        self.entries[key] = entry
        self.entries.move_to_end(key)
        while len(self.entries) > self.keep:
            self.entries.popitem(last=False)


def splittable(model) -> bool:
    """Whether the decoder's forward is one this module runs layer by layer as it does itself (Llama's)."""
    from transformers.models.llama.modeling_llama import LlamaModel

    from .decode import cache_kw

    dec, _ = _parts(model)
    return type(dec) is LlamaModel and cache_kw(model) == "cache"


class _Split:
    """How one chunk's passes run: from layer ``start`` on hidden states saved by an earlier reader
    (``entry``), or from the embeddings, saving the states entering each layer in ``saves``."""

    def __init__(self, start: int, saves: set[int], entry: dict[int, dict] | None):
        self.start, self.saves = start, saves
        self.entry: dict[int, dict] = entry if entry is not None else {}


def _logp(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    z = logits.float()
    if temperature <= 0:  # greedy: all mass on the argmax
        out = torch.full_like(z, -math.inf)
        out.scatter_(-1, z.argmax(-1, keepdim=True), 0.0)
        return out
    return torch.log_softmax(z / temperature, dim=-1)


@torch.inference_mode()
def readout(model, classes: TokenClasses, prompts: list[list[int]], temperature: float, spec: Readout,
            generator: torch.Generator, pad_id: int, batch: int = 32, shared: Shared | None = None,
            start: int = 0, saves: frozenset[int] | set[int] = frozenset(), weights: tuple = ()
            ) -> list[ReadoutResult]:
    """The readout of every prompt, ``batch`` prompts at a time. With ``shared``: the active weights are the
    base's in every layer below ``start`` (``weights`` identifies the base's), so a chunk whose states entering
    layer ``start`` another reader saved runs from there; a chunk read from the embeddings saves the states
    entering each layer of ``saves`` (all at or below ``start``)."""
    out: list[ReadoutResult] = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        split = None
        if shared is not None:
            key = (weights, tuple(map(tuple, chunk)), spec.outcome, spec.max_tokens, spec.max_nodes)
            entry = shared.get(key, start) if start > 0 else None
            split = _Split(start if entry is not None else 0, set(saves), entry)
        out += _chunk(model, classes, chunk, temperature, spec, generator, pad_id, split)
        if split is not None and split.start == 0 and split.saves:
            shared.put(key, split.entry)  # type: ignore[union-attr]
    return out


def _tree(classes: TokenClasses, spec: Readout) -> list[tuple[int, int, str]]:
    """The continuations that leave the decision open, up to ``max_tokens - 1`` tokens deep, as nodes
    (parent index, -1 for the root; token; text), parents first. Which token leaves it open depends only on
    the text before it, so the tree is the same for every prompt; at most ``max_nodes`` nodes."""
    out: list[tuple[int, int, str]] = []
    frontier = [(-1, "")]
    for depth in range(1, spec.max_tokens):
        nxt = []
        for parent, text in frontier:
            _, open_ids = classes.of(spec, text, depth == spec.max_tokens)
            for t in open_ids.tolist():
                if len(out) >= spec.max_nodes:
                    return out
                out.append((parent, t, text + classes.texts[t]))
                nxt.append((len(out) - 1, text + classes.texts[t]))
        frontier = nxt
    return out


def _chunk(model, classes: TokenClasses, prompts: list[list[int]], temperature: float, spec: Readout,
           generator: torch.Generator, pad_id: int, split: _Split | None = None) -> list[ReadoutResult]:
    device = next(model.parameters()).device
    b = len(prompts)
    key = ("tree", spec.outcome, spec.max_tokens, spec.max_nodes)
    if key not in classes.cache:
        classes.cache[key] = _tree(classes, spec)  # type: ignore[assignment]
    tree: list[tuple[int, int, str]] = classes.cache[key]  # type: ignore[assignment]
    # the prompts' common prefix once, then each row's own part, right-padded
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != prompts[0][i]), n)
    lens = torch.tensor([len(p) - n for p in prompts], device=device)
    width = int(lens.max())
    ids = torch.full((b, width), pad_id, dtype=torch.long, device=device)
    for r, p in enumerate(prompts):
        ids[r, :len(p) - n] = torch.tensor(p[n:], device=device)
    own = torch.arange(width, device=device)[None, :] < lens[:, None]
    cache = None
    if n > 0:
        head = torch.tensor([prompts[0][:n]], device=device)
        _, pre = _run(model, head, torch.ones_like(head), torch.arange(n, device=device)[None], None,
                      torch.tensor([[n - 1]], device=device), split, 0)
        cache = select_cache_rows(model, pre, torch.zeros(b, dtype=torch.long, device=device))
    mask = torch.cat([torch.ones(b, n, dtype=torch.bool, device=device), own], 1)
    logits, cache = _run(model, ids, mask.long(), (n + torch.arange(width, device=device))[None].expand(b, -1), cache,
                         (lens - 1)[:, None], split, 1)
    lps = [[_logp(logits[r, 0], temperature)] for r in range(b)]  # per row: the root's, then each tree node's
    if tree:
        # every open continuation in one pass on top of the prompts, each attending to its row's prompt and
        # to its own ancestors (a tree mask), at the positions it would have as a reply
        k = len(tree)
        anc = torch.zeros(k, k, dtype=torch.bool, device=device)
        depth: list[int] = []
        for i, (parent, _, _) in enumerate(tree):
            anc[i, i] = True
            if parent >= 0:
                anc[i] |= anc[parent]
            depth.append(1 if parent < 0 else depth[parent] + 1)
        m4 = torch.cat([mask[:, None, :].expand(b, k, -1), anc[None].expand(b, -1, -1)], 2)[:, None]
        pos = n + lens[:, None] + torch.tensor(depth, device=device)[None] - 1
        toks = torch.tensor([t for _, t, _ in tree], device=device)[None].expand(b, -1)
        logits, _ = _run(model, toks, m4, pos, cache, torch.arange(k, device=device)[None].expand(b, -1), split, 2)
        for r in range(b):
            lps[r] += [_logp(logits[r, i], temperature) for i in range(k)]
    return [_read(classes, spec, tree, lps[r], generator) for r in range(b)]


def _read(classes: TokenClasses, spec: Readout, tree: list[tuple[int, int, str]], lps: list[torch.Tensor],
          generator: torch.Generator) -> ReadoutResult:
    """A row's decision distribution from its nodes' next-token log-probs (``lps[0]`` the root's, ``lps[i + 1]``
    tree node i's), and one reply drawn from the same distributions."""
    child = {(parent, t): i for i, (parent, t, _) in enumerate(tree)}
    dist: dict[Any, float] = {}
    stack = [(-1, "", 0.0, 0)]  # (node, text, log-prob of the path, depth)
    while stack:
        node, text, lp_path, d = stack.pop()
        lp = lps[node + 1]
        groups, open_ids = classes.of(spec, text, d + 1 == spec.max_tokens)
        probs = lp.exp()
        w = math.exp(lp_path)
        for o, tids in groups.items():
            mass = float(probs[tids].sum()) * w
            if mass > 0:
                dist[o] = dist.get(o, 0.0) + mass
        for t in open_ids[probs[open_ids] > 0].tolist():
            q = lp_path + float(lp[t])
            if (node, t) in child:
                stack.append((child[(node, t)], text + classes.texts[t], q, d + 1))
            else:  # beyond max_nodes: read as final where it stands
                o = spec.outcome(text + classes.texts[t], True)
                dist[o] = dist.get(o, 0.0) + math.exp(q)
    ids: list[int] = []
    out_lps: list[float] = []
    text, node, outcome = "", -1, None
    for d in range(1, spec.max_tokens + 1):
        lp = lps[node + 1]
        t = int(torch.multinomial(lp.exp(), 1, generator=generator))
        ids.append(t)
        out_lps.append(float(lp[t]))
        text += classes.texts[t]
        outcome = spec.outcome(text, d == spec.max_tokens)
        if outcome is not None:
            break
        if (node, t) not in child:
            outcome = spec.outcome(text, True)
            break
        node = child[(node, t)]
    total = sum(dist.values())
    if total > 0:
        dist = {o: v / total for o, v in dist.items()}  # (float rounding: the masses sum to 1 up to it)
    return ReadoutResult(dist=dist, completion=Completion(text=text, token_ids=ids, logprobs=out_lps,
                                                          finish_reason="stop"), outcome=outcome)
