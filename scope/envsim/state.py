"""States and their changes, leaf by leaf: the labels of environment simulation.

A state is JSON (tables of records). ``diff(before, after)`` lists what changed as
``{"type": "add" | "modify" | "delete", "path": "table.key.field.0.x", "value": ...}`` (an added subtree is
one ``add`` whose value is the subtree; ``|changes|`` counts the changed leaves, so an added record of five
fields counts five). ``apply(state, changes)`` performs such a list on a copy. Paths join keys with dots;
a list index is a decimal key. ``strict_match`` (no change missing, none invented, deletes handled) and
``lenient_match`` (only the true changed paths are looked at, as EnvSimBench's released check does) score a
predicted change list against the true next state.
"""
from __future__ import annotations

import copy
import json
from typing import Any

Change = dict[str, Any]


def canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def leaves(v: Any) -> int:
    """The number of leaves of a value (a scalar, or an empty container, is one)."""
    if isinstance(v, dict) and v:
        return sum(leaves(x) for x in v.values())
    if isinstance(v, list) and v:
        return sum(leaves(x) for x in v)
    return 1


def diff(before: Any, after: Any, path: tuple[str, ...] = ()) -> list[Change]:
    """The changes that turn ``before`` into ``after`` (see the module docstring)."""
    out: list[Change] = []
    p = ".".join(path)
    if isinstance(before, dict) and isinstance(after, dict):
        for k in before:
            if k not in after:
                out.append({"type": "delete", "path": _join(path, k)})
        for k, v in after.items():
            if k not in before:
                out.append({"type": "add", "path": _join(path, k), "value": copy.deepcopy(v)})
            else:
                out += diff(before[k], v, path + (str(k),))
        return out
    if isinstance(before, list) and isinstance(after, list):
        for i in range(min(len(before), len(after))):
            out += diff(before[i], after[i], path + (str(i),))
        for i in range(len(before), len(after)):
            out.append({"type": "add", "path": _join(path, str(i)), "value": copy.deepcopy(after[i])})
        for i in range(len(after), len(before))[::-1]:
            out.append({"type": "delete", "path": _join(path, str(i))})
        return out
    if canon(before) != canon(after):
        out.append({"type": "modify", "path": p, "value": copy.deepcopy(after)})
    return out


def _join(path: tuple[str, ...], key: Any) -> str:
    return ".".join(path + (str(key),))


def size(changes: list[Change]) -> int:
    """|changes| in changed leaves."""
    return sum(leaves(c.get("value")) if c.get("type") == "add" else 1 for c in changes)


class BadChange(ValueError):
    pass


def apply(state: Any, changes: list[Change]) -> Any:
    """A copy of ``state`` with ``changes`` performed in order; a change that cannot be performed (a path
    through a missing or scalar node, a bad type) raises :class:`BadChange`."""
    out = copy.deepcopy(state)
    for c in changes:
        if not isinstance(c, dict) or c.get("type") not in ("add", "modify", "delete") or \
                not isinstance(c.get("path"), str) or not c["path"]:
            raise BadChange(f"not a change: {str(c)[:200]}")
        keys = c["path"].split(".")
        node = out
        for k in keys[:-1]:
            node = _child(node, k, c["path"])
        last = keys[-1]
        if c["type"] == "delete":
            if isinstance(node, dict) and last in node:
                del node[last]
            elif isinstance(node, list) and last.isdigit() and int(last) < len(node):
                del node[int(last)]
            else:
                raise BadChange(f"delete {c['path']}: no such path")
            continue
        if "value" not in c:
            raise BadChange(f"{c['type']} {c['path']}: no value")
        if isinstance(node, dict):
            if c["type"] == "modify" and last not in node:
                raise BadChange(f"modify {c['path']}: no such path")
            node[last] = copy.deepcopy(c["value"])
        elif isinstance(node, list) and last.isdigit():
            i = int(last)
            if i < len(node):
                node[i] = copy.deepcopy(c["value"])
            elif i == len(node) and c["type"] == "add":
                node.append(copy.deepcopy(c["value"]))
            else:
                raise BadChange(f"{c['type']} {c['path']}: index out of range")
        else:
            raise BadChange(f"{c['type']} {c['path']}: its parent is not a container")
    return out


def _child(node: Any, k: str, path: str) -> Any:
    if isinstance(node, dict) and k in node:
        return node[k]
    if isinstance(node, list) and k.isdigit() and int(k) < len(node):
        return node[int(k)]
    raise BadChange(f"{path}: no node {k!r} on the way")


def get_path(state: Any, path: str) -> tuple[bool, Any]:
    """(present, value) at a dotted path."""
    node = state
    for k in path.split("."):
        if isinstance(node, dict) and k in node:
            node = node[k]
        elif isinstance(node, list) and k.isdigit() and int(k) < len(node):
            node = node[int(k)]
        else:
            return False, None
    return True, node


def strict_match(before: Any, after: Any, predicted: list[Change]) -> bool:
    """The predicted changes, performed on ``before``, give exactly ``after``: no change missing, none
    invented, deletes included."""
    try:
        return canon(apply(before, predicted)) == canon(after)
    except BadChange:
        return False


def lenient_match(before: Any, after: Any, predicted: list[Change]) -> bool:
    """Only the true changed paths are checked: each has its true value (or is absent where it was
    deleted) once the predicted changes are performed. Invented changes elsewhere pass unnoticed."""
    try:
        got = apply(before, predicted)
    except BadChange:
        return False
    for c in diff(before, after):
        present, v = get_path(got, c["path"])
        if c["type"] == "delete":
            if present:
                return False
        elif not present or canon(v) != canon(c["value"]):
            return False
    return True
