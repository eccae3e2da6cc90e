"""Find JSON inside model output in linear time.

Model replies wrap JSON in prose, code fences or nothing at all, and sometimes break it. A scan that
tries to decode at every ``{`` or ``[`` costs quadratic time on a reply of nested brackets; these
helpers look at each character a bounded number of times:

- :func:`json_spans` finds the maximal balanced ``{...}`` / ``[...]`` spans (brackets inside JSON
  strings do not count; quotes outside brackets are prose), which are disjoint, so decoding each
  one once is linear in total;
- :func:`json_values` decodes them in order; :func:`first_json` decodes them in order and returns the first
  value (or nested value) that a predicate accepts;
- :func:`string_tokens` lexes the complete JSON strings of a text in one pass (for salvaging pairs
  such as ``"text": "..."`` from JSON that is broken as a whole).
"""
from __future__ import annotations

import json
import re
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


def walk(obj: Any) -> Iterator[Any]:
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


def json_values(text: str) -> Iterator[Any]:
    """The decodable maximal bracket spans of ``text``, decoded, in order (each span decoded once)."""
    for a, b in json_spans(text):
        try:
            yield json.loads(text[a:b])
        except (ValueError, RecursionError):
            continue


def first_json(text: str, accept: Callable[[Any], bool] = lambda o: True) -> Any:
    """The first JSON value in ``text`` (a maximal bracket span, or a value nested in one) that
    ``accept`` accepts; None if there is none. Never raises on bad input."""
    if not isinstance(text, str):
        return None
    for obj in json_values(text):
        for x in walk(obj):
            try:
                if accept(x):
                    return x
            except Exception:  # noqa: BLE001 - a predicate on arbitrary data
                continue
    return None


_STRING = re.compile(r'"([^"\\]*(?:\\.[^"\\]*)*)"', re.DOTALL)


def string_tokens(text: str) -> list[tuple[int, int, str]]:
    """Every complete JSON string of ``text`` as (start, end, body as written), left to right; decode a
    body with :func:`decode_string`. Linear: a quote that is never closed is scanned once, to the end,
    and no later quote can open a closed string (every one of them is escaped)."""
    out = []
    i = 0
    while True:
        j = text.find('"', i)
        m = _STRING.match(text, j) if j >= 0 else None
        if m is None:
            break
        i = m.end()
        out.append((m.start(), m.end(), m.group(1)))
    return out


def decode_string(body: str) -> str:
    """The value of a JSON string body (its escapes resolved; kept as written if they are invalid)."""
    if "\\" not in body:
        return body
    try:
        return json.loads('"' + body + '"')
    except ValueError:
        return body
