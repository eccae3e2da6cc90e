"""Find JSON inside model output in linear time.

Model replies wrap JSON in prose, code fences or nothing at all, and sometimes break it. A scan that
tries to decode at every ``{`` or ``[`` costs quadratic time on a reply of nested brackets; these
helpers look at each character a bounded number of times:

- :func:`json_spans` finds the maximal balanced ``{...}`` / ``[...]`` spans (brackets inside JSON
  strings do not count; quotes outside brackets are prose), which are disjoint, so decoding each
  one once is linear in total;
- :func:`first_json` decodes them in order and returns the first value (or nested value) that a
  predicate accepts;
- :func:`string_tokens` lexes the complete JSON strings of a text in one pass (for salvaging pairs
  such as ``"text": "..."`` from JSON that is broken as a whole).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterator

_PAIR = {"}": "{", "]": "["}


def json_spans(text: str) -> list[tuple[int, int]]:
    """The maximal balanced bracket spans of ``text`` as (start, end) with ``text[start:end]``, in order."""
    spans: list[tuple[int, int]] = []
    stack: list[tuple[str, int]] = []
    in_str = esc = False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"' and stack:
            in_str = True
        elif ch in "{[":
            stack.append((ch, i))
        elif ch in "}]":
            if not stack or stack[-1][0] != _PAIR[ch]:
                stack.clear()  # a stray or mismatched closer: nothing open can be valid JSON
                continue
            _, start = stack.pop()
            while spans and spans[-1][0] > start:  # spans inside this one are not maximal
                spans.pop()
            spans.append((start, i + 1))
    return spans


def _walk(obj: Any) -> Iterator[Any]:
    """``obj`` and every value nested in it, outermost first (breadth first, iteratively)."""
    queue = [obj]
    k = 0
    while k < len(queue):
        x = queue[k]
        k += 1
        yield x
        if isinstance(x, dict):
            queue.extend(x.values())
        elif isinstance(x, list):
            queue.extend(x)


def first_json(text: str, accept: Callable[[Any], bool] = lambda o: True) -> Any:
    """The first JSON value in ``text`` (a maximal bracket span, or a value nested in one) that
    ``accept`` accepts; None if there is none. Never raises on bad input."""
    if not isinstance(text, str):
        return None
    for a, b in json_spans(text):
        try:
            obj = json.loads(text[a:b])
        except (ValueError, RecursionError):
            continue
        for x in _walk(obj):
            try:
                if accept(x):
                    return x
            except Exception:  # noqa: BLE001 - a predicate on arbitrary data
                continue
    return None


def string_tokens(text: str) -> list[tuple[int, int, str]]:
    """Every complete JSON string of ``text`` as (start, end, decoded value), left to right; a quote
    that is never closed ends the scan. Linear: each character is read once."""
    out = []
    i, n = 0, len(text)
    while i < n:
        j = text.find('"', i)
        if j < 0:
            break
        k, esc = j + 1, False
        while k < n:
            c = text[k]
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                break
            k += 1
        if k >= n:
            break
        try:
            value = json.loads(text[j:k + 1])
        except ValueError:
            value = text[j + 1:k]
        out.append((j, k + 1, value))
        i = k + 1
    return out
