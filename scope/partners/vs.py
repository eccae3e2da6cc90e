"""Verbalized Sampling: ask a partner for k candidate replies (with stated probabilities) and sample one.

The stated "probability" is the model's words, not a token log-prob. Method ``prob`` samples by the
stated probabilities (normalised; missing, negative or non-numeric ones are treated as 0, and if all
are 0 the draw is uniform); method ``random`` ignores them and draws uniformly.
"""
from __future__ import annotations

import itertools
import json
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..textjson import decode_string, json_spans, string_tokens, walk


JSON_PREFIX = '{"responses": [{"text": "'
"""The start of the reply a local VS partner is given (endpoints get a JSON-schema response format)."""


def instruction(k: int, method: str, max_words: int | None = None, start: str = "") -> str:
    if method == "prob":
        item = '{"text": "<reply>", "probability": <number between 0 and 1>}'
        tail = (f"Give {k} different replies you might write next, each with the probability that you would "
                f"write it.")
    else:
        item = '{"text": "<reply>"}'
        tail = f"Give {k} different replies you might write next."
    length = f" Keep each reply under {max_words} words." if max_words else ""
    begin = f" Each reply must begin with `{start}` and go on from there." if start else ""  # (not next to "]")
    return (f"[{tail} Answer only with a JSON object of the form "
            f'{{"responses": [{item}, ...]}} and nothing else.{length}{begin}]')


def json_start(start: str) -> str:
    """``start`` as it reads inside a JSON string (what a local partner's first candidate is given)."""
    return json.dumps(start)[1:-1]


def starting_with(p: VSParse, start: str) -> VSParse:
    """The candidates of ``p`` that begin with ``start`` (a reply the environment forces to start so, e.g.
    a persuadee's final decision), their stated probabilities renormalised; an error if none does."""
    if not p.ok or not start:
        return p
    keep = [(t, q) for t, q in zip(p.texts, p.probs) if t.startswith(start.strip())]
    if not keep:
        return VSParse(error=f"no candidate begins with the forced start {start!r}")
    total = sum(q for _, q in keep)
    probs = [q / total for _, q in keep] if total > 0 else [1.0 / len(keep)] * len(keep)
    return VSParse(texts=[t for t, _ in keep], probs=probs)


def max_words(setting: int | str | None, max_new_tokens: int) -> int | None:
    """The length guide a VS request gives: ``setting`` as configured ("auto": 3/4 of the plain reply's
    token budget, at least 5 words)."""
    if setting == "auto":
        return max(5, (3 * max_new_tokens) // 4)
    return setting  # type: ignore[return-value]


_OPEN_TEXT = re.compile(r'"text"\s*:\s*"')
_CLOSED_STRING = re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL)  # the rest of a JSON string, up to its closing quote


def runaway(raw: str, max_chars: int) -> bool:
    """True if the last candidate text in ``raw`` is still open after more than ``max_chars`` characters.

    A local VS partner stops there (a candidate is one reply, and no reply needs to be that long);
    the complete candidates before it are salvaged by :func:`parse`, or the request is re-asked.
    """
    last = None
    for m in _OPEN_TEXT.finditer(raw):
        last = m
    if last is None:
        return False
    tail = raw[last.end():]
    return _CLOSED_STRING.match(tail) is None and len(tail) > max_chars


def complete(raw: str, k: int) -> bool:
    """True once ``raw`` holds ``k`` complete candidate objects, or has begun a (k+1)-th candidate: a
    local VS partner stops there, since :func:`parse` keeps at most ``k`` candidates anyway."""
    return sum(1 for c in _items(raw) if c[2]) >= k or len(_OPEN_TEXT.findall(raw)) > k


def json_schema(k: int, method: str) -> dict[str, Any]:
    props: dict[str, Any] = {"text": {"type": "string"}}
    req = ["text"]
    if method == "prob":
        props["probability"] = {"type": "number"}
        req.append("probability")
    return {"name": "verbalized_sampling", "schema": {
        "type": "object", "required": ["responses"], "additionalProperties": False,
        "properties": {"responses": {"type": "array", "minItems": 1, "maxItems": k, "items": {
            "type": "object", "required": req, "additionalProperties": False, "properties": props}}}}}


@dataclass
class VSParse:
    """Either ``texts`` with ``probs`` (a distribution over non-empty texts) or ``error`` (fallback)."""

    texts: list[str] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


_COLON = re.compile(r"\s*:\s*")
_PROB_TAIL = re.compile(r'\s*,\s*"(?:probability|prob)"\s*:\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)')
_CLOSE = re.compile(r"\s*\}")
_PLACEHOLDER = re.compile(r"^(?:<[^<>]{0,60}>|\.\.\.|…|text|response|responses|probability|prob|string|str|number"
                          r"|float)$", re.IGNORECASE)
"""The format's own placeholders, keys and JSON-schema type names: an echo of the request, not a reply."""


def _items(raw: str) -> list[tuple[str, float | None, bool]]:
    """``("text": "...", "probability": x)`` pairs found in ``raw`` whether or not its JSON is whole, as
    (text, probability or None, whether the object is closed right after); one linear scan."""
    toks = string_tokens(raw)
    out = []
    for i, (_start, end, value) in enumerate(toks[:-1]):
        if value not in ("text", "response"):
            continue
        colon = _COLON.match(raw, end)
        nxt = toks[i + 1]
        if colon is None or colon.group(0).count(":") != 1 or nxt[0] != colon.end():
            continue
        prob = _PROB_TAIL.match(raw, nxt[1])
        tail = prob.end() if prob else nxt[1]
        out.append((decode_string(nxt[2]), float(prob.group(1)) if prob else None,
                    _CLOSE.match(raw, tail) is not None))
    return out


def _candidate_list(o: Any) -> list | None:
    if isinstance(o, dict):
        for key in ("responses", "candidates", "replies"):
            if isinstance(o.get(key), list):
                return o[key]
    return None


def _prob(v: Any) -> float:
    if isinstance(v, bool):
        return 0.0
    if isinstance(v, (int, float)):
        x = float(v)
    elif isinstance(v, str):
        t = v.strip().rstrip("%")
        try:
            x = float(t) / (100.0 if v.strip().endswith("%") else 1.0)
        except ValueError:
            return 0.0
    else:
        return 0.0
    return x if x > 0 and not math.isnan(x) else 0.0  # an infinite statement is the largest there is


def parse(raw: Any, k: int = 5, method: str = "prob") -> VSParse:
    """Parse a VS reply. Never raises: anything unusable becomes ``VSParse(error=...)``."""
    try:
        return _parse(raw, k, method)
    except Exception as e:  # noqa: BLE001 - a parser of model output must not crash a rollout
        return VSParse(error=f"unparseable ({type(e).__name__})")


def _usable(items: list, k: int) -> tuple[list[str], list[float]]:
    """The first ``k`` non-empty candidates in a candidate list, with their stated probabilities."""
    texts, probs = [], []
    for it in items:
        if isinstance(it, dict):
            text = it.get("text", it.get("response"))
            p = it.get("probability", it.get("prob"))
        elif isinstance(it, str):
            text, p = it, None
        else:
            continue
        if not isinstance(text, str) or not _has_content(text) or _PLACEHOLDER.match(text.strip()):
            continue  # empty or JSON punctuation only, or the instruction's own placeholder echoed back
        texts.append(text.strip())
        probs.append(_prob(p))
        if len(texts) == k:
            break
    return texts, probs


_JSON_PUNCT = " \t\r\n{}[]\":,"


def _has_content(text: str) -> bool:
    """Whether a candidate holds anything besides whitespace (any Unicode space) and JSON punctuation."""
    return any(not c.isspace() and c not in _JSON_PUNCT for c in text)
_LIST_KEY = re.compile(r'\{\s*"(?:responses|candidates|replies)"\s*:')
_MAX_RESTARTS = 16  # decoding restarts at candidate-list keys: each reads at most the rest of the reply once


def _restarts(raw: str):
    """Objects decoded from each ``{"responses": ...`` in turn (at most ``_MAX_RESTARTS``): a broken first
    attempt (an unclosed string) throws the bracket scan's idea of what is quoted off for the rest of the
    reply, so a complete object after it is found by decoding from its own opening brace."""
    dec = json.JSONDecoder()
    for n, m in enumerate(_LIST_KEY.finditer(raw)):
        if n >= _MAX_RESTARTS:
            return
        try:
            yield dec.raw_decode(raw, m.start())[0]
        except (ValueError, RecursionError):
            continue


def _spans(raw: str):
    """(non-space length, value) of each decodable maximal bracket span of ``raw``, in order."""
    for a, b in json_spans(raw):
        try:
            value = json.loads(raw[a:b])
        except (ValueError, RecursionError):
            continue
        yield sum(not c.isspace() for c in raw[a:b]), value


def _parse(raw: Any, k: int, method: str) -> VSParse:
    if not isinstance(raw, str):
        return VSParse(error="reply is not text")
    found_list = False
    texts: list[str] = []
    probs: list[float] = []
    solid = sum(not c.isspace() for c in raw)
    for span, value in itertools.chain(_spans(raw), ((solid, v) for v in _restarts(raw))):  # an object with a
        # candidate list (at any depth), or a bare list; the restarts only when the scan found none usable
        holder = next((x for x in walk(value) if _candidate_list(x) is not None), None)
        # a bare list is a reply only where it is most of the reply, not one that chance made inside junk
        bare = value if isinstance(value, list) and 2 * span >= solid else None
        items = _candidate_list(holder) if holder is not None else bare
        if items is None:
            continue
        found_list = True
        texts, probs = _usable(items, k)
        if texts:  # an empty or placeholder-only list (e.g. a stray '"responses": []') is passed over
            break
    if not texts:  # salvage the candidate objects of a reply whose JSON is not whole
        salvaged = [{"text": t, "probability": p} for t, p, _ in _items(raw)]
        found_list = found_list or bool(salvaged)
        texts, probs = _usable(salvaged, k)
    if not found_list:
        return VSParse(error="no JSON list of responses found")
    if not texts:
        return VSParse(error="no non-empty candidate (an echo of the format is not a candidate set)")
    top = max(probs)
    if method == "random" or top <= 0:
        probs = [1.0] * len(texts)
    elif math.isinf(top):  # "1e999": the infinite statements share the mass
        probs = [1.0 if math.isinf(p) else 0.0 for p in probs]
    else:  # scaled by the largest first: huge stated numbers neither overflow nor vanish
        probs = [p / top for p in probs]
    total = sum(probs)
    return VSParse(texts=texts, probs=[p / total for p in probs])


def draw(p: VSParse, rng: random.Random) -> int:
    u, acc = rng.random(), 0.0
    for i, w in enumerate(p.probs):
        acc += w
        if u < acc:
            return i
    return len(p.probs) - 1


# ---- the decoder: how the rollout engine asks a Verbalized Sampling partner for a reply -------------------
RUNAWAY_CHARS_PER_TOKEN = 6
"""A local VS candidate longer than this many characters per token of the partner's plain
``max_new_tokens`` is a runaway (see :func:`runaway`)."""


@dataclass
class Ask:
    """One reply to ask for: the role's view of the dialogue, its environment's random generator (the draw
    among the candidates), and its session (the engine's key/value reuse)."""

    view: list[dict[str, str]]
    rng: random.Random
    session: Any = None


@dataclass
class Outcome:
    text: str = ""
    finish_reason: str = "eos"
    error: BaseException | None = None
    record: dict[str, Any] = field(default_factory=dict)
    """What the episode keeps of the turn (its ``vs`` field): candidates, stated probabilities, the drawn
    index, attempts, parse errors, and whether the plain fallback was used."""


Chat = Callable[..., list]
"""``chat(convs, sampling, response_format=None, prefix="", sessions=None)``: one batched text call to the
partner's model, a Completion or an exception per conversation."""


def with_instruction(view: list[dict[str, str]], text: str) -> list[dict[str, str]]:
    """``view`` with ``text`` added to its last user turn (or as a user turn of its own)."""
    msgs = [dict(m) for m in view]
    if msgs and msgs[-1]["role"] == "user":
        msgs[-1]["content"] = msgs[-1]["content"] + "\n\n" + text
    else:
        msgs.append({"role": "user", "content": text})
    return msgs


def decode(asks: list[Ask], cfg: Any, sampling: Any, start: str, chat: Chat, count: Callable[[str, int], None],
           local: bool, schema: bool = False) -> list[Outcome]:
    """Verbalized Sampling for replies that must begin with ``start`` (usually none): each ask gets the VS
    instruction (``cfg``: k, method, max_words, max_new_tokens, max_reasks), its candidates are parsed and one
    is drawn; a failed parse is asked again up to ``max_reasks`` times, then the plain reply is the fallback.
    Every candidate is asked to begin with ``start``, a local model's first one is given it, and only
    candidates that do are drawn from; the plain fallback of a local model is given it too. A local model gets
    the opening of the JSON object and stops once the list is closed, or once it has k complete candidates; a
    candidate that runs on far longer than a plain reply could is started over at once, in the running batch.
    An endpoint that takes a JSON schema (``schema``) gets one. ``count(model_id, tokens)`` is told every
    call's tokens."""
    from ..types import SamplingParams

    instr = instruction(cfg.k, cfg.method, max_words(cfg.max_words, sampling.max_new_tokens), start=start)
    rf = {"type": "json_schema", "json_schema": json_schema(cfg.k, cfg.method)} if schema else None
    prefix = JSON_PREFIX + json_start(start) if local else ""
    limit = RUNAWAY_CHARS_PER_TOKEN * sampling.max_new_tokens

    def stop_fn(text: str) -> bool:  # (a runaway with no restart left is stopped too)
        return complete(prefix + text, cfg.k) or runaway(prefix + text, limit)

    def restart_fn(text: str) -> bool:
        return runaway(prefix + text, limit)

    out = {id(a): Outcome(record={"attempts": 0, "errors": []}) for a in asks}
    todo, left_over = list(asks), []
    while todo:
        left = min(1 + cfg.max_reasks - out[id(a)].record["attempts"] for a in todo)
        vs_sp = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                               max_new_tokens=cfg.max_new_tokens, stop=("]}",) if local else (),
                               stop_fn=stop_fn if local else None, restart_fn=restart_fn if local else None,
                               max_restarts=left - 1)
        outs = chat([with_instruction(a.view, instr) for a in todo], vs_sp, rf, prefix, [a.session for a in todo])
        again = []
        for a, c in zip(todo, outs):
            o = out[id(a)]
            rec = o.record
            rec["attempts"] += 1
            if isinstance(c, BaseException):
                rec["errors"].append(f"{type(c).__name__}: {c}")
            else:
                rec["attempts"] += len(c.discarded)
                rec["errors"] += ["runaway candidate (restarted in the batch)"] * len(c.discarded)
                count(c.model_id, len(c.token_ids) + c.discarded_tokens)
                parsed = starting_with(parse(c.text, cfg.k, cfg.method), start)
                if parsed.ok:
                    idx = draw(parsed, a.rng)
                    rec.update(candidates=parsed.texts, probs=parsed.probs, index=idx, fallback=False)
                    o.text = parsed.texts[idx]
                    continue
                rec["errors"].append(parsed.error)
            if rec["attempts"] < 1 + cfg.max_reasks:
                again.append(a)
            else:
                left_over.append(a)
        todo = again
    if left_over:  # plain reply as the fallback
        outs = chat([a.view for a in left_over], sampling, None, start, [a.session for a in left_over])
        for a, c in zip(left_over, outs):
            o = out[id(a)]
            o.record.update(candidates=[], probs=[], index=None, fallback=True)
            if isinstance(c, BaseException):
                o.error = c
            else:
                o.text, o.finish_reason = c.text, c.finish_reason
                count(c.model_id, len(c.token_ids))
    return [out[id(a)] for a in asks]
