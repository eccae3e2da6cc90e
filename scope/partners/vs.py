"""Verbalized Sampling: ask a partner for k candidate replies (with stated probabilities) and sample one.

The stated "probability" is the model's words, not a token log-prob. Method ``prob`` samples by the
stated probabilities (normalised; missing, negative or non-numeric ones are treated as 0, and if all
are 0 the draw is uniform); method ``random`` ignores them and draws uniformly.
"""
from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any


JSON_PREFIX = '{"responses": [{"text": "'
"""The start of the reply a local VS partner is given (endpoints get a JSON-schema response format)."""


def instruction(k: int, method: str) -> str:
    if method == "prob":
        item = '{"text": "<reply>", "probability": <number between 0 and 1>}'
        tail = (f"Give {k} different replies you might write next, each with the probability that you would "
                f"write it.")
    else:
        item = '{"text": "<reply>"}'
        tail = f"Give {k} different replies you might write next."
    return (f"[{tail} Answer only with a JSON object of the form "
            f'{{"responses": [{item}, ...]}} and nothing else.]')


_OPEN_TEXT = re.compile(r'"text"\s*:\s*"')
_CLOSED_STRING = re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL)  # the rest of a JSON string, up to its closing quote


def runaway(raw: str, max_chars: int) -> bool:
    """True if the last candidate text in ``raw`` is still open after more than ``max_chars`` characters.

    A local VS partner stops there (a candidate is one reply, and no reply needs to be that long);
    the complete candidates before it are salvaged by :func:`parse`, or the request is re-asked.
    """
    last = None
    for last in _OPEN_TEXT.finditer(raw):
        pass
    if last is None:
        return False
    tail = raw[last.end():]
    return _CLOSED_STRING.match(tail) is None and len(tail) > max_chars


def complete(raw: str, k: int) -> bool:
    """True once ``raw`` holds ``k`` complete candidate objects, or has begun a (k+1)-th candidate: a
    local VS partner stops there, since :func:`parse` keeps at most ``k`` candidates anyway."""
    n = 0
    for _ in _ITEM.finditer(raw):
        n += 1
        if n >= k:
            return True
    return len(_OPEN_TEXT.findall(raw)) > k


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


def _json_candidates(s: str):
    """Yield every decodable JSON value that starts at a '{' or '[' in ``s``, outermost first."""
    dec = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", s):
        try:
            obj, _ = dec.raw_decode(s, m.start())
        except (ValueError, RecursionError):
            continue
        yield obj


_ITEM = re.compile(r'\{\s*"text"\s*:\s*"((?:[^"\\]|\\.)*)"\s*(?:,\s*"probability"\s*:\s*'
                   r'(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?))?\s*\}')
_LOOSE_ITEM = re.compile(r'"text"\s*:\s*"((?:[^"\\]|\\.)*)"(?:\s*,\s*"probability"\s*:\s*'
                         r'(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?))?')


def _salvage(raw: str) -> list[dict[str, Any]]:
    """``"text": "...", "probability": ...`` pairs inside a reply whose JSON as a whole is broken (cut
    off before the list was closed, braces left out); a text must be a complete JSON string."""
    out = []
    for m in _LOOSE_ITEM.finditer(raw):
        try:
            text = json.loads(f'"{m.group(1)}"')
        except ValueError:
            continue
        out.append({"text": text, "probability": float(m.group(2)) if m.group(2) else None})
    return out


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
    return x if math.isfinite(x) and x > 0 else 0.0


def parse(raw: Any, k: int = 5, method: str = "prob") -> VSParse:
    """Parse a VS reply. Never raises: anything unusable becomes ``VSParse(error=...)``."""
    try:
        return _parse(raw, k, method)
    except Exception as e:  # noqa: BLE001 - a parser of model output must not crash a rollout
        return VSParse(error=f"unparseable ({type(e).__name__})")


def _parse(raw: Any, k: int, method: str) -> VSParse:
    if not isinstance(raw, str):
        return VSParse(error="reply is not text")
    items = None
    for obj in _json_candidates(raw):
        if isinstance(obj, dict):
            for key in ("responses", "candidates", "replies"):
                if isinstance(obj.get(key), list):
                    items = obj[key]
                    break
        elif isinstance(obj, list):
            items = obj
        if items is not None:
            break
    if items is None:
        items = _salvage(raw)
    if not items:
        return VSParse(error="no JSON list of responses found")
    texts, probs = [], []
    for it in items:
        if isinstance(it, dict):
            text = it.get("text", it.get("response"))
            p = it.get("probability", it.get("prob"))
        elif isinstance(it, str):
            text, p = it, None
        else:
            continue
        if not isinstance(text, str) or not text.strip():
            continue
        texts.append(text.strip())
        probs.append(_prob(p))
        if len(texts) == k:
            break
    if not texts:
        return VSParse(error="no non-empty candidate")
    if method == "random" or sum(probs) <= 0:
        probs = [1.0] * len(texts)
    total = sum(probs)
    return VSParse(texts=texts, probs=[p / total for p in probs])


def draw(p: VSParse, rng: random.Random) -> int:
    u, acc = rng.random(), 0.0
    for i, w in enumerate(p.probs):
        acc += w
        if u < acc:
            return i
    return len(p.probs) - 1
