"""Tool simulators: what answers a tool call when no real tool runs, and the checks a constrained one obeys.

Every simulator maps a sample's context (the tool's schema, the state slice, the calls so far, the call)
to a prediction ``{"feedback": str, "changes": [...], "tokens": int, "calls": int}``:

- ``ExactSimulator``: the exact tool on the slice (what a perfect simulator says);
- ``NoChangeSimulator``: says nothing changed (a floor: right on every no-change sample, wrong elsewhere);
- ``NoisyOracle``: the exact answer, corrupted at known rates (per changed-fields bucket for the changes,
  one rate for the feedback), so that the benchmark's measured accuracies can be checked against them;
- ``ModelSimulator``: a model (any binding: a local model, ``scope serve``, an OpenAI-compatible endpoint)
  prompted with the context and asked for JSON; with ``constrained``, its proposed changes are checked
  against the tool's schema and the domain's invariants before they count (``violations``): a violation is
  sent back once for repair, then the call fails as a tool error.
"""
from __future__ import annotations

import copy
import json
import random
from typing import Any, Protocol

from ..envs.tau2.tools import DOMAINS
from ..textjson import first_json
from .state import BadChange, apply, canon, size

SYSTEM = """You simulate the tools of a {domain} customer-service system. You get a tool's JSON schema, the \
database records the call can read (JSON), the calls made so far, and the call. Answer with only a JSON object:
{{"feedback": <exactly what the tool returns: its JSON result, or "Error: <message>" when the call is refused>,
 "config_changes": [{{"type": "add" | "modify" | "delete", "path": "<table>.<key>.<field>...", "value": <new value>}}]}}
List every database field the call changes (none for a read or a refused call); a path joins keys with dots \
and list positions with their index."""


def prompt(sample: dict[str, Any], with_policy: str | None = None) -> list[dict[str, str]]:
    tool = DOMAINS[sample["domain"]][sample["tool"]]
    hist = "\n".join(f"- {h['tool']}({json.dumps(h['arguments'])}) -> {h['feedback'][:300]}"
                     for h in sample["history"]) or "(none)"
    system = SYSTEM.format(domain=sample["domain"])
    if with_policy:
        system += "\n\nThe system's policy:\n" + with_policy
    user = (f"Tool schema: {json.dumps(tool.schema())}\n\nDatabase records: {json.dumps(sample['state'])}\n\n"
            f"Calls so far:\n{hist}\n\nCall: {sample['tool']}({json.dumps(sample['arguments'])})")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse(text: str) -> tuple[str | None, list[dict[str, Any]] | None]:
    """(feedback, changes) from a simulator's reply; None where the reply does not give it."""
    obj = first_json(text, lambda o: isinstance(o, dict) and "feedback" in o)
    if obj is None:
        return None, None
    fb = obj.get("feedback")
    fb = fb if isinstance(fb, str) else json.dumps(fb, sort_keys=True, default=str)
    ch = obj.get("config_changes", [])
    return fb, ch if isinstance(ch, list) else None


def feedback_match(pred: str | None, true: str) -> bool:
    """The feedback is right: the same JSON value, or the same text (errors: the same message)."""
    if pred is None:
        return False
    try:
        return canon(json.loads(pred)) == canon(json.loads(true))
    except (ValueError, TypeError):
        return pred.strip() == true.strip()


class Simulator(Protocol):
    """What the bench runs (``bench.run``): a name, and a prediction for each sample."""

    name: str

    def predict(self, samples: list[dict[str, Any]]) -> list[dict[str, Any]]: ...


class ExactSimulator:
    name = "exact tools"

    def predict(self, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"feedback": s["feedback"], "changes": copy.deepcopy(s["changes"]), "tokens": 0, "calls": 0}
                for s in samples]


class NoChangeSimulator:
    name = "no change"

    def predict(self, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"feedback": "{}", "changes": [], "tokens": 0, "calls": 0} for _ in samples]


def bucket(sample: dict[str, Any]) -> str:
    n = size(sample["changes"])
    return "3+" if n >= 3 else str(n)


class NoisyOracle:
    """The exact answer with injected errors: with probability ``feedback_error`` the feedback is replaced, and
    with probability ``change_error[bucket]`` the changes are corrupted (a true change dropped, a value
    altered, or, on a no-change sample, a change invented), decided per sample by a seeded draw."""

    name = "noisy oracle"

    def __init__(self, feedback_error: float = 0.1, change_error: dict[str, float] | None = None, seed: int = 0):
        self.feedback_error = feedback_error
        self.change_error = change_error or {"0": 0.05, "1": 0.2, "2": 0.4, "3+": 0.6}
        self.seed = seed

    def predict(self, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for s in samples:
            rng = random.Random(f"{self.seed}/{s['id']}")
            fb = s["feedback"] if rng.random() >= self.feedback_error else json.dumps({"simulated": "wrong"})
            ch = copy.deepcopy(s["changes"])
            if rng.random() < self.change_error[bucket(s)]:
                if not ch:  # an invented change of a real field (one a lenient check does not look at)
                    ch = [{"type": "modify", "path": _some_leaf(s["state"]), "value": "__invented__"}]
                elif rng.random() < 0.5:
                    ch.pop(rng.randrange(len(ch)))
                else:
                    c = ch[rng.randrange(len(ch))]
                    c["value"] = "__altered__" if c["type"] != "delete" else None
                    c["type"] = "modify" if c["type"] == "delete" else c["type"]
            out.append({"feedback": fb, "changes": ch, "tokens": 0, "calls": 0})
        return out


def _some_leaf(state: Any) -> str:
    """The path of the first scalar leaf of a state (the slice always holds one record or more)."""
    path: list[str] = []
    node = state
    while isinstance(node, (dict, list)) and node:
        k = next(iter(node)) if isinstance(node, dict) else 0
        path.append(str(k))
        node = node[k]
    return ".".join(path)


# ---- the constrained mode's checks ------------------------------------------------------------------
STATUS_MOVES = {  # the status changes the tools make, per (table, from): what a write may turn it into
    ("orders", "pending"): {"cancelled", "pending (item modified)"},
    ("orders", "delivered"): {"return requested", "exchange requested"},
}
NON_NEGATIVE = ("balance", "amount", "available_seats", "price", "total_baggages", "nonfree_baggages")


def _kind(v: Any) -> str:
    return "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__


def violations(sample: dict[str, Any], changes: list[dict[str, Any]] | None) -> list[str]:
    """What is wrong with proposed changes, checked before they are applied: the list's shape, paths that
    must exist (a record the call cannot reach, a field that is not there), a value of another type than the
    field holds, a negative balance, count or price, and a status change no tool makes; a read tool, or a
    refused call, changes nothing."""
    if changes is None:
        return ["config_changes must be a list of changes"]
    tool = DOMAINS[sample["domain"]][sample["tool"]]
    if changes and tool.kind != "write":
        return [f"{sample['tool']} is a {tool.kind} tool: it changes nothing"]
    out = []
    state = sample["state"]
    for c in changes:
        if not isinstance(c, dict) or c.get("type") not in ("add", "modify", "delete") or \
                not isinstance(c.get("path"), str):
            out.append(f"not a change: {str(c)[:120]}")
            continue
        keys = c["path"].split(".")
        if len(keys) >= 2 and c["type"] != "add" and keys[1] not in state.get(keys[0], {}):
            out.append(f"{c['path']}: record {keys[0]}.{keys[1]} is not among the records the call can reach")
            continue
        node: Any = state
        ok = True
        for k in keys[:-1]:
            if isinstance(node, dict) and k in node:
                node = node[k]
            elif isinstance(node, list) and k.isdigit() and int(k) < len(node):
                node = node[int(k)]
            else:
                ok = c["type"] == "add" and len(keys) > 2 and keys[1] not in state.get(keys[0], {})
                break
        if not ok:
            out.append(f"{c['path']}: no such place in the records")
            continue
        last = keys[-1]
        old = node.get(last) if isinstance(node, dict) else None
        if c["type"] == "modify":
            if isinstance(node, dict) and last not in node:
                out.append(f"{c['path']}: modify of a field that does not exist (add it)")
                continue
            if old is not None and _kind(old) != _kind(c.get("value")):
                out.append(f"{c['path']}: a {_kind(c.get('value'))} where the field holds a {_kind(old)}")
            if last == "status" and len(keys) >= 2 and \
                    c.get("value") not in STATUS_MOVES.get((keys[0], str(old)), {old}):
                out.append(f"{c['path']}: no tool turns status {old!r} into {c.get('value')!r}")
        v = c.get("value")
        if last in NON_NEGATIVE and isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
            out.append(f"{c['path']}: {last} cannot be negative ({v})")
    if not out:
        try:
            apply(state, changes)
        except BadChange as e:
            out.append(str(e))
    return out


class ModelSimulator:
    """A model plays the tool (see the module docstring)."""

    def __init__(self, binding, constrained: bool = False, policy: str | None = None, max_context: int = 8192,
                 batch: int = 16):
        self.binding, self.constrained, self.policy, self.max_context = binding, constrained, policy, max_context
        self.batch = batch  # samples per model call (their prompts hold database records: memory grows with it)
        self.name = f"{binding.id}{' (constrained)' if constrained else ''}"

    def _ask(self, convs: list[list[dict[str, str]]]) -> list[tuple[str, int]]:
        from ..rollout import chat_complete

        outs = chat_complete(self.binding.ref, convs, self.binding.sampling)
        res = []
        for o in outs:
            if isinstance(o, BaseException):
                res.append(("", 0))
            else:
                res.append((o.text, len(o.token_ids) or len(o.text) // 4))
        return res

    def predict(self, samples: list[dict[str, Any]], batch: int | None = None) -> list[dict[str, Any]]:
        batch = batch or self.batch
        out: list[dict[str, Any]] = []
        for i in range(0, len(samples), batch):
            chunk = samples[i:i + batch]
            convs = [prompt(s, self.policy) for s in chunk]
            replies = self._ask(convs)
            preds: list[dict[str, Any]] = []
            for _s, conv, (text, n) in zip(chunk, convs, replies):
                fb, ch = parse(text)
                preds.append({"feedback": fb, "changes": ch or [], "tokens": n, "calls": 1, "reply": text[:2000],
                              "conv": conv, "raw_changes": ch})
            if self.constrained:
                redo = [(j, violations(s, p["raw_changes"])) for j, (s, p) in enumerate(zip(chunk, preds))]
                redo = [(j, v) for j, v in redo if v]
                if redo:
                    convs2 = [preds[j]["conv"] + [{"role": "assistant", "content": preds[j]["reply"]},
                                                  {"role": "user", "content": "Your changes break these rules:\n- "
                                                   + "\n- ".join(v) + "\nAnswer again with the corrected JSON."}]
                              for j, v in redo]
                    for (j, _), (text, n) in zip(redo, self._ask(convs2)):
                        fb, ch = parse(text)
                        p = preds[j]
                        p["tokens"] += n
                        p["calls"] += 1
                        p["repaired"] = True
                        if violations(chunk[j], ch):  # still broken: the call fails as a tool error
                            p.update(feedback="Error: the simulated tool could not complete the call", changes=[],
                                     failed=True)
                        else:
                            p.update(feedback=fb, changes=ch or [])
            for p in preds:
                p.pop("conv", None)
                p.pop("raw_changes", None)
            out += preds
        return out
