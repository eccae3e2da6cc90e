"""tau2-bench retail and airline as scope environments (``env.name: tau2_retail`` / ``tau2_airline``).

The agent is a customer-service agent with the domain policy and tool schemas in its system
prompt; the partner is the user simulator (the guidelines plus the task's user scenario), which
never sees tool calls or results.

Tool-call format (documented for the agent in its prompt): a reply that contains

    <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>

is a tool call (the first such block counts; the text around it is not sent to the user). The
result (or the error) comes back to the agent as a message ``<tool_result>...</tool_result>`` and
the agent speaks again. Any other reply goes to the user. A malformed call (bad JSON, unknown tool,
bad arguments) gets an error result and is counted; ``max_errors`` (10) tool errors end the episode,
as in tau2. The user ends the dialogue with ``###STOP###``, ``###TRANSFER###`` or
``###OUT-OF-SCOPE###``; ``max_steps`` (30) messages, tool calls included, end it otherwise.

Reward (tau2's rules for these task files): 0 unless the user ended the episode; otherwise the
product of the task's reward bases: DB (the agent's write calls and the gold actions are replayed
on fresh databases and their hashes compared) and COMMUNICATE (each required string appears in an
agent message to the user, case-insensitive, commas removed). NL_ASSERTION needs an LLM judge and is
not scored here; it is recorded as skipped.
"""
from __future__ import annotations

import json
import os
import random
import re
from functools import lru_cache
from typing import Any

from ...types import Task
from ..base import Env, register_env
from .db import OverlayDB
from .tools import DOMAINS, ToolError, call_tool

STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
GREETING = "Hi! How can I help you today?"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def resolve_data_dir(path: str | None = None) -> str:
    d = path or os.environ.get("SCOPE_TAU2_DATA")
    if not d:
        raise FileNotFoundError("tau2 data: set env.options.data_dir or SCOPE_TAU2_DATA to a directory with "
                                "domains/{retail,airline} (get it with `scope data tau2 DIR`)")
    if not os.path.isdir(os.path.join(d, "domains")):
        raise FileNotFoundError(f"tau2 data: {d} has no domains/ directory")
    return d


@lru_cache(maxsize=4)
def load_domain(root: str, domain: str) -> dict[str, Any]:
    base = os.path.join(root, "domains", domain)
    need = ["db.json", "tasks.json", "split_tasks.json", "policy.md"]
    missing = [f for f in need if not os.path.exists(os.path.join(base, f))]
    if missing:
        raise FileNotFoundError(f"tau2 {domain}: missing {missing} in {base}")
    guide = os.path.join(root, "user_simulator", "simulation_guidelines.md")
    if not os.path.exists(guide):
        raise FileNotFoundError(f"tau2: missing {guide}")
    with open(os.path.join(base, "db.json")) as f:
        db = json.load(f)
    with open(os.path.join(base, "tasks.json")) as f:
        tasks = json.load(f)
    with open(os.path.join(base, "split_tasks.json")) as f:
        splits = json.load(f)
    with open(os.path.join(base, "policy.md")) as f:
        policy = f.read()
    with open(guide) as f:
        guidelines = f.read()
    return {"db": db, "tasks": {str(t["id"]): t for t in tasks}, "splits": splits, "policy": policy,
            "guidelines": guidelines}


def agent_prompt(domain: str, policy: str) -> str:
    schemas = "\n".join(json.dumps(t.schema()) for t in DOMAINS[domain].values())
    return (f"{policy}\n\n## Tools\nYou can call these tools (JSON schemas):\n{schemas}\n\n"
            "To call a tool, reply with only\n<tool_call>{\"name\": \"TOOL_NAME\", \"arguments\": {...}}</tool_call>\n"
            "You will get the result as <tool_result>...</tool_result>. Make one tool call at a time. "
            "Any reply without a tool call is sent to the user.")


def user_prompt(guidelines: str, scenario: dict[str, Any]) -> str:
    ins = scenario.get("instructions") or {}
    if isinstance(ins, str):
        text = ins
    else:
        parts = [f"{k.replace('_', ' ').capitalize()}: {v}" for k, v in ins.items() if v and k != "domain"]
        text = "\n".join(parts)
    persona = scenario.get("persona")
    return (f"{guidelines}\n\n## Your scenario\n" + (f"Persona: {persona}\n" if persona else "") + text)


def parse_tool_call(text: str) -> tuple[str | None, dict | None, str | None]:
    """(name, arguments, error) of the first <tool_call> block; (None, None, None) if there is none."""
    m = _CALL.search(text)
    if not m:
        return None, None, None
    body = m.group(1).strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return None, None, f"malformed tool call: {e.msg}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, None, "malformed tool call: expected {\"name\": ..., \"arguments\": {...}}"
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None, None, "malformed tool call: arguments are not a JSON object"
    return obj["name"], args, None


def _jsonable(x: Any) -> str:
    return x if isinstance(x, str) else json.dumps(x)


def replay(domain: str, base: dict, actions: list[dict]) -> tuple[OverlayDB, list[str]]:
    """Apply tool calls in order on a fresh database; return it and the errors met."""
    db, errors = OverlayDB(base), []
    for a in actions:
        try:
            call_tool(domain, db, a["name"], a.get("arguments", {}))
        except ToolError as e:
            errors.append(f"{a['name']}: {e}")
    return db, errors


def _norm(s: str) -> str:
    return s.lower().replace(",", "")


def evaluate(domain: str, data: dict, task: dict, agent_calls: list[dict], agent_messages: list[str],
             ended_by_user: bool) -> dict[str, Any]:
    crit = task.get("evaluation_criteria") or {}
    basis = list(crit.get("reward_basis") or ["DB"])
    out: dict[str, Any] = {"basis": basis, "ended_by_user": ended_by_user}
    if not ended_by_user:
        out["reward"] = 0.0
        return out
    reward = 1.0
    if "DB" in basis:
        tools = DOMAINS[domain]
        writes = [c for c in agent_calls if c["name"] in tools and tools[c["name"]].kind == "write"]
        got, _ = replay(domain, data["db"], writes)
        gold, gold_err = replay(domain, data["db"], crit.get("actions") or [])
        ok = got.hash() == gold.hash()
        out["db"] = 1.0 if ok else 0.0
        if gold_err:
            out["gold_errors"] = gold_err
        reward *= out["db"]
    if "COMMUNICATE" in basis:
        said = _norm("\n".join(agent_messages))
        need = crit.get("communicate_info") or []
        hits = {s: _norm(str(s)) in said for s in need}
        out["communicate"] = 1.0 if all(hits.values()) else 0.0
        out["communicate_hits"] = hits
        reward *= out["communicate"]
    if "NL_ASSERTION" in basis:
        out["nl_assertion"] = "skipped (needs an LLM judge)"
    out["reward"] = reward
    return out


class Tau2Env(Env):
    domain = "retail"
    roles = ("agent", "partner")

    def __init__(self, task: Task, rng: random.Random, data_dir: str | None = None, max_steps: int = 30,
                 max_errors: int = 10, **_: Any):
        super().__init__(task, rng)
        self.data = load_domain(resolve_data_dir(data_dir), self.domain)
        self.raw = task.data["task"]
        self.db = OverlayDB(self.data["db"])
        self.max_steps, self.max_errors = max_steps, max_errors
        self.steps, self.tool_errors, self.malformed = 0, 0, 0
        self.calls: list[dict[str, Any]] = []
        self.to_user: list[str] = []
        self.pending_agent = False  # the agent made a tool call and speaks again
        self.ended_by_user = False
        self.views["agent"] = [{"role": "system", "content": agent_prompt(self.domain, self.data["policy"])},
                               {"role": "assistant", "content": GREETING}]
        self.views["partner"] = [{"role": "system",
                                  "content": user_prompt(self.data["guidelines"], self.raw.get("user_scenario") or {})},
                                 {"role": "user", "content": GREETING}]
        self.transcript.append({"role": "agent", "content": GREETING})
        self.meta.update(task=str(self.raw["id"]), domain=self.domain)

    def next_role(self) -> str | None:
        if self.done:
            return None
        return "agent" if self.pending_agent or self.transcript[-1]["role"] != "agent" else "partner"

    def _count_step(self) -> None:
        self.steps += 1
        if self.steps >= self.max_steps and not self.done:
            self.finish("max_steps")

    def on_reply(self, role: str, text: str) -> None:
        self.turns[role] += 1
        if role == "partner":
            self.say("partner", text)
            if any(t in text for t in STOP_TOKENS):
                self.ended_by_user = True
                self.finish("user_stop")
            self._count_step()
            return
        name, args, err = parse_tool_call(text)
        if name is None and err is None:  # a message to the user
            self.pending_agent = False
            self.say("agent", text)
            self.to_user.append(text)
            self._count_step()
            return
        # a tool call: the agent's own view keeps its exact reply, the user sees nothing
        self.views["agent"].append({"role": "assistant", "content": text})
        if err is None:
            try:
                result = _jsonable(call_tool(self.domain, self.db, name, args))
                self.calls.append({"name": name, "arguments": args})
            except ToolError as e:
                err = str(e)
        if err is not None:
            self.tool_errors += 1
            self.malformed += err.startswith("malformed")
            result = f"Error: {err}"
        self.transcript.append({"role": "tool", "content": f"{name}({json.dumps(args)}) -> {result[:2000]}"})
        self.views["agent"].append({"role": "user", "content": f"<tool_result>{result}</tool_result>"})
        self.pending_agent = True
        if self.tool_errors >= self.max_errors:
            self.finish("too_many_errors")
        self._count_step()

    def rewards(self) -> dict[str, float]:
        ev = evaluate(self.domain, self.data, self.raw, self.calls, self.to_user, self.ended_by_user)
        self.meta.update(evaluation=ev, tool_calls=len(self.calls), tool_errors=self.tool_errors,
                         malformed_calls=self.malformed)
        return {"agent": ev["reward"], "partner": ev["reward"]}

    @classmethod
    def load_tasks(cls, split: str, data_dir: str | None = None, **_: Any) -> list[Task]:
        data = load_domain(resolve_data_dir(data_dir), cls.domain)
        ids = list(data["tasks"]) if split == "all" else data["splits"].get(split)
        if ids is None:
            raise ValueError(f"tau2 {cls.domain}: no split {split!r}; have {sorted(data['splits'])}")
        return [Task(id=f"tau2_{cls.domain}/{i}", split=split, data={"task": data["tasks"][str(i)]}) for i in ids]


@register_env("tau2_retail")
class Tau2Retail(Tau2Env):
    domain = "retail"


@register_env("tau2_airline")
class Tau2Airline(Tau2Env):
    domain = "airline"
