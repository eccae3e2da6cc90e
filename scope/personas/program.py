"""Persona generators as programs: a Python module with a ``DATA`` literal and ``generate(task, rng)``, run only
inside the cooperative-coding sandbox.

A program genome is source text. Its contract: ``generate(task, rng) -> {"text": str, ...}`` for one persona
of the task (``task``: the task's data as JSON, e.g. a P4G survey persona or a tau2 user scenario; ``rng``: a
``random.Random``), and a top-level ``DATA = {...}`` literal that the structural operators edit (``traits``:
``[name, role-play text, probability]`` rows; ``population``; ``template``). A model may rewrite the whole
program (``ProgramMutator``); the structural operators (``mutate_program``) re-draw a probability, add or drop
a trait from the axis library, or cross two programs' traits, and write the source back from ``DATA``.

Expanding a program runs it in bubblewrap (no network, a private read-only system, CPU, memory, process and
wall-clock limits; ``Sandbox``) through a small runner that imports it, calls ``generate`` for each (task,
seed) and prints JSON; the output is checked (``PERSONA_SCHEMA``: one object per request, a non-empty text of
at most ``MAX_PERSONA`` characters). A program that fails, loops, prints something else or tries to leave the
sandbox gets no personas (``ProgramFailure``, with the reason); the search scores it 0 and counts it.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import pprint
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from .genome import Genome, library_for

MAX_PERSONA = 1200
MAX_SOURCE = 8000
RUNNER = r'''
import json, random, sys
sys.path.insert(0, ".")
import program
reqs = json.load(open("requests.json"))
out = []
for r in reqs:
    p = program.generate(r["task"], random.Random(r["seed"]))
    out.append(p)
sys.stdout.write("SCOPE_PERSONAS " + json.dumps(out))
'''
TEMPLATE = '''"""A persona generator: each trait is on with its probability; the persona is the template filled in."""
DATA = {data}


def generate(task, rng):
    on = [t for t in DATA["traits"] if rng.random() < t[2]]
    traits = " ".join(t[1] for t in on)
    text = DATA["template"].replace("{{population}}", DATA["population"]).replace("{{traits}}", traits)
    return {{"text": " ".join(text.split()), "axes": {{t[0]: t in on for t in DATA["traits"]}}}}
'''


class ProgramFailure(RuntimeError):
    pass


def source_from_data(data: dict[str, Any]) -> str:
    return TEMPLATE.format(data=pprint.pformat(data, width=110, sort_dicts=False))


MAX_NESTING = 64
"""Brackets nested deeper than this, or a line of more operators than MAX_OPERATORS: a text not parsed."""
MAX_OPERATORS = 400


def parse_bounded(source: str) -> ast.Module | None:
    """``ast.parse`` of a model-written program, or None: bounded in length and nesting before it is parsed
    (a sum of thousands of terms, thousands of unary minus signs or a long attribute chain would exhaust the
    parser's stack or memory), and any failure of the parse itself is None too."""
    if not isinstance(source, str) or len(source) > MAX_SOURCE:
        return None
    depth = 0
    for ch in source:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth > MAX_NESTING:
            return None
    if any(sum(line.count(c) for c in "+-*/%~&|^.<>=") > MAX_OPERATORS for line in source.splitlines()):
        return None
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def valid_data(data: Any) -> bool:
    """A program's DATA as mutation reads it: a dict whose ``traits`` (where present) is a list of
    [name, text, probability] with a text name, a text and a number in [0, 1]."""
    if not isinstance(data, dict):
        return False
    traits = data.get("traits", [])
    return isinstance(traits, list) and all(
        isinstance(t, list) and len(t) == 3 and isinstance(t[0], str) and isinstance(t[1], str)
        and isinstance(t[2], (int, float)) and not isinstance(t[2], bool) and 0.0 <= t[2] <= 1.0 for t in traits) \
        and all(isinstance(data.get(k, ""), str) for k in ("population", "template"))


def data_of(source: str) -> dict[str, Any] | None:
    """The program's top-level ``DATA`` literal, or None when it has none or one that :func:`valid_data` refuses
    (a model may write any program)."""
    tree = parse_bounded(source)
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DATA" for t in node.targets):
            try:
                v = ast.literal_eval(node.value)
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                return None
            return v if valid_data(v) else None
    return None


@dataclass
class ProgramGenome:
    source: str
    parents: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    kind: str = "program"

    @property
    def id(self) -> str:
        return "p" + hashlib.sha256(self.source.encode()).hexdigest()[:9]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "program", "id": self.id, "source": self.source, "parents": list(self.parents),
                "ops": list(self.ops)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ProgramGenome":
        if not isinstance(d.get("source"), str) or len(d["source"]) > MAX_SOURCE:
            raise ValueError(f"program genome: source must be text of at most {MAX_SOURCE} characters")
        return cls(d["source"], list(d.get("parents", [])), list(d.get("ops", [])))

    @classmethod
    def from_genome(cls, g: Genome) -> "ProgramGenome":
        """The program that draws what a structured genome draws."""
        data = {"population": g.population, "template": g.roleplay,
                "traits": [[a.name, a.on, a.p_on] for a in g.axes]}
        return cls(source_from_data(data), parents=[g.id], ops=["from_structured"])

    def expand(self, n: int, rng: random.Random, tasks: list[dict[str, Any]] | None = None,
               sandbox_limits=None) -> list[dict[str, Any]]:
        """``n`` personas (for the given tasks' data, cycled; none: an empty task), made in the sandbox."""
        reqs = [{"task": (tasks[i % len(tasks)] if tasks else {}), "seed": rng.randrange(2 ** 31)} for i in range(n)]
        out = run_program(self.source, reqs, sandbox_limits)
        return [{"id": f"{self.id}-{i}", "text": p["text"], "axes": p.get("axes") or {}} for i, p in enumerate(out)]


def run_program(source: str, requests: list[dict[str, Any]], limits=None) -> list[dict[str, Any]]:
    """Run ``generate`` for each request inside the sandbox; raises ProgramFailure (why) for a program that
    fails, loops, prints anything but its personas, or whose personas break ``PERSONA_SCHEMA``."""
    from ..envs.coop.sandbox import Limits, Sandbox, make_workspace, remove_workspace

    if len(source) > MAX_SOURCE:
        raise ProgramFailure(f"source over {MAX_SOURCE} characters")
    lim = limits or Limits(cpu_seconds=5, wall_seconds=15, memory_mb=256, max_processes=16, max_output_bytes=1 << 20,
                           max_file_mb=4, workspace_mb=16)
    d = tempfile.mkdtemp(prefix="scope-persona-")
    ws = make_workspace(os.path.join(d, "ws"), lim)
    try:
        for name, text in (("program.py", source), ("runner.py", RUNNER), ("requests.json", json.dumps(requests))):
            with open(os.path.join(ws, name), "w") as f:
                f.write(text)
        import sys

        r = Sandbox(ws, lim).run(f"{sys.executable} -I runner.py")
    finally:
        remove_workspace(ws)
        shutil.rmtree(d, ignore_errors=True)
    if r.timed_out:
        raise ProgramFailure("timed out")
    if r.exit_code != 0:
        last = r.output.strip().splitlines()[-1:] or [""]
        raise ProgramFailure(f"exit {r.exit_code}: {last[0][:200]}")
    head, sep, body = r.output.partition("SCOPE_PERSONAS ")
    if not sep:
        raise ProgramFailure("printed no personas")
    try:
        out = json.loads(body)
    except ValueError as e:
        raise ProgramFailure(f"unreadable output: {e}") from None
    check_personas(out, len(requests))
    return out


def check_personas(out: Any, n: int) -> None:
    """PERSONA_SCHEMA: a list of ``n`` objects, each with a non-empty ``text`` of at most MAX_PERSONA characters
    (and optionally an ``axes`` object)."""
    if not isinstance(out, list) or len(out) != n:
        raise ProgramFailure(f"expected a list of {n} personas")
    for p in out:
        if not isinstance(p, dict) or not isinstance(p.get("text"), str) or not p["text"].strip():
            raise ProgramFailure("a persona without text")
        if len(p["text"]) > MAX_PERSONA:
            raise ProgramFailure(f"a persona over {MAX_PERSONA} characters")
        if "axes" in p and not isinstance(p["axes"], dict):
            raise ProgramFailure("axes must be an object")


def mutate_program(g: ProgramGenome, rng: random.Random, other: Any = None) -> ProgramGenome:
    """A structural change of a program's DATA (as ``genome.mutate_structure`` changes a structured genome):
    re-draw a trait's probability, add a library trait, drop a trait, or take the other program's traits
    (crossover). A program without a readable DATA is returned as it is, with op ``none``."""
    data = data_of(g.source)
    if data is None or not isinstance(data.get("traits"), list):
        return ProgramGenome(g.source, parents=[g.id], ops=["none"])
    data = copy.deepcopy(data)
    traits = data["traits"]
    other_data = data_of(other.source) if isinstance(other, ProgramGenome) else None
    ops = ["p", "add", "drop"] + (["crossover"] if other_data and isinstance(other_data.get("traits"), list) else [])
    op = rng.choice(ops)
    names = {t[0] for t in traits if isinstance(t, list) and t}
    if op == "add":
        free = [a for a in library_for(str(data.get("population", ""))) if a.name not in names]
        if free:
            a = rng.choice(free)
            traits.append([a.name, a.on, round(rng.uniform(0.2, 0.8), 2)])
        else:
            op = "p"
    if op == "drop":
        if len(traits) > 1:
            traits.pop(rng.randrange(len(traits)))
        else:
            op = "p"
    if op == "crossover" and other_data is not None:
        pool = {t[0]: t for t in traits + other_data["traits"] if isinstance(t, list) and len(t) == 3}
        k = max(1, min(len(pool), (len(traits) + len(other_data["traits"])) // 2))
        data["traits"] = [pool[n] for n in rng.sample(sorted(pool), k)]
    if op == "p" and traits:
        t = rng.choice(traits)
        if isinstance(t, list) and len(t) == 3 and isinstance(t[2], (int, float)):
            t[2] = round(min(1.0, max(0.0, t[2] + rng.choice([-1, 1]) * rng.uniform(0.1, 0.4))), 2)
    return ProgramGenome(source_from_data(data), parents=[g.id] + ([other.id] if other is not None else []), ops=[op])


REWRITE_PROMPT = """Below is a Python program that writes personas for a user simulator: role-play instructions \
for a person chatting with an assistant. Rewrite it so that the people it describes behave more like real \
people in such chats (some terse, some chatty, some doubtful, some off topic), keeping the same interface: a \
top-level DATA dictionary and a function generate(task, rng) returning {{"text": ...}}. Use only the standard \
library. Answer with the whole program in one ```python block.

```python
{source}
```"""


def extract_program(text: str) -> str | None:
    """The program of a model's reply: the first ```python block that parses (bounded: :func:`parse_bounded`),
    defines ``generate`` and, where it has a DATA, one that :func:`valid_data` admits."""
    import re

    for m in re.finditer(r"```(?:python)?\s*\n(.*?)```", (text or "")[:4 * MAX_SOURCE], re.DOTALL):
        src = m.group(1).strip() + "\n"
        tree = parse_bounded(src)
        if tree is None or not any(isinstance(n, ast.FunctionDef) and n.name == "generate" for n in tree.body):
            continue
        has_data = any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DATA" for t in n.targets)
                       for n in tree.body)
        if has_data and data_of(src) is None:
            continue
        return src
    return None
