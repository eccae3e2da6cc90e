"""``coop_coding``: two coding agents, one repository, one feature each; graded on the merge of their patches.

A task is a pair of features of one repository (CooperBench's layout, see :mod:`.tasks`). Each agent
(roles ``agent`` and ``partner``: the agent trains, the partner is any partner source: frozen, self-play,
a pool) gets its own copy of the base repository and sees only its own ``feature.md``.

**Actions.** One command per turn, in a fenced block (```` ```bash ... ``` ````; a reply without a block
gets a reminder of the format, and the turn counts). The command runs in the agent's workspace in the
sandbox, and its output (exit status, capped text) is the agent's next observation. Two commands are
scope's own:

- ``send_message <text>`` (or ``send_message <<'MSG'`` ... ``MSG``): the text reaches the other agent at
  the start of its next observation as ``[Message from <agent>]: <text>``;
- ``submit``: the agent is done; its patch is the diff of its workspace against the base, taken on the
  host with a copy of the repository's .git made before the agent ran anything (the workspace's own .git
  is the agent's to write and is never read there: no agent-written git configuration, hook or
  attribute driver runs outside the sandbox).

Both agents act in every round (``next_roles``: the rollout engine samples them together, beside every
other dialogue's; one that submitted sits out); a message sent in a round reaches the other agent at its
next turn. An agent that reaches ``max_turns`` is submitted
as it stands. At the end both patches are graded as CooperBench grades them (:mod:`.evaluate`): the pair
succeeds iff both features' hidden tests pass on the merged tree.

**Reward** (each role the same): 1 for a success; else ``partial_credit`` (default 0) when the role's own
feature passes; plus the shaped terms ``shaping.applies`` (both patches apply), ``shaping.clean_merge``
and ``shaping.tests`` (the fraction of hidden tests passed), each weighted by its option (default 0).
"""
from __future__ import annotations

import os
import re
import shutil
import weakref
from typing import Any

from ...types import Episode, Task
from ..base import Env, register_env
from . import evaluate
from .sandbox import Limits, Sandbox, make_workspace, remove_workspace, work_dir

SYSTEM = """You are {me}, one of two software engineers working at the same time on the same Python repository.
You implement one feature; {other} implements another one in its own copy of the repository. Your changes
and {other}'s are merged at the end, and both features' hidden tests must pass on the merged code, so tell
{other} which files and functions you change, and avoid editing the same lines.

Each reply holds exactly one shell command in a fenced block:
```bash
<command>
```
The command runs in your copy of the repository (no network); you see its output in the next message.
Special commands:
- send_message <text>   sends <text> to {other}
- submit                ends your work; your changes (git diff) are your submission

Your feature:
{feature}"""

_BLOCK = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)```", re.DOTALL)
_HEREDOC = re.compile(r"^send_message\s*<<-?\s*['\"]?(\w+)['\"]?\s*\n(.*?)\n\1\s*$", re.DOTALL)


def parse_action(reply: str) -> tuple[str, str] | None:
    """``(kind, arg)`` with kind ``bash`` | ``message`` | ``submit``, or None when the reply holds no command."""
    m = _BLOCK.search(reply)
    if m is None:
        return None
    cmd = m.group(1).strip()
    if not cmd:
        return None
    if cmd in ("submit", "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT") or cmd.startswith("submit\n"):
        return "submit", ""
    h = _HEREDOC.match(cmd)
    if h:
        return "message", h.group(2).strip()
    if cmd.split(None, 1)[0] == "send_message":
        return "message", cmd[len("send_message"):].strip().strip("'\"")
    return "bash", cmd


def _remove_work(work: str, workspaces: dict[str, str]) -> None:
    for ws in workspaces.values():
        remove_workspace(ws)
    remove_workspace(work)


@register_env("coop_coding")
class CoopCoding(Env):
    roles = ("agent", "partner")

    def __init__(self, task: Task, rng, data_dir: str | None = None, max_turns: int = 50,
                 partial_credit: float = 0.0, shaping_applies: float = 0.0, shaping_clean_merge: float = 0.0,
                 shaping_tests: float = 0.0, command_seconds: float = 60.0, test_seconds: float = 300.0,
                 max_output_bytes: int = 8192, workspace_mb: int = 512, allow_unsandboxed: bool = False):
        super().__init__(task, rng)
        self.max_turns = max_turns
        self.partial_credit = partial_credit
        self.shaping = {"applies": shaping_applies, "clean_merge": shaping_clean_merge, "tests": shaping_tests}
        self.test_seconds = test_seconds
        self.allow_unsandboxed = allow_unsandboxed
        self.limits = Limits(wall_seconds=command_seconds, max_output_bytes=max_output_bytes, workspace_mb=workspace_mb)
        d = task.data
        self.base_dir: str = d["repo_dir"]
        self.features: dict[str, dict[str, str]] = {"agent": d["features"][0], "partner": d["features"][1]}
        self.names = {"agent": "agent1", "partner": "agent2"}
        self.work = work_dir("coop")
        self.ws: dict[str, str] = {}
        self._cleanup = weakref.finalize(self, _remove_work, self.work, self.ws)
        self.gitdirs: dict[str, str] = {}  # each workspace's .git as it was before the agent ran anything
        self.boxes: dict[str, Sandbox] = {}
        for r in self.roles:
            ws = make_workspace(os.path.join(self.work, self.names[r]), self.limits)
            self.ws[r] = ws
            evaluate.init_repo(self.base_dir, ws)
            self.gitdirs[r] = os.path.join(self.work, f"{self.names[r]}.git")
            shutil.copytree(os.path.join(ws, ".git"), self.gitdirs[r], symlinks=True)
            self.boxes[r] = Sandbox(ws, self.limits, allow_unsandboxed=allow_unsandboxed)
        self.submitted: dict[str, bool] = {r: False for r in self.roles}
        self.pending: dict[str, list[str]] = {r: [] for r in self.roles}  # what a role sees at its next turn
        self.stats: dict[str, dict[str, Any]] = {
            r: {"messages": 0, "commands": 0, "malformed": 0, "submit_turn": None} for r in self.roles}
        self._turn = 0
        self.result: evaluate.PairResult | None = None
        for r in self.roles:
            other = self.names[self.roles[1 - self.roles.index(r)]]
            self.views[r].append({"role": "system", "content": SYSTEM.format(
                me=self.names[r], other=other, feature=self.features[r]["description"].strip())})
            self.views[r].append({"role": "user", "content": "Begin. Your first command?"})

    # -- turns --
    def next_roles(self) -> list[str]:
        """Both coders act in every round (one that submitted sits out); what one sends in a round reaches
        the other at its next turn, as messages between two people working at once do."""
        if self.done:
            return []
        roles = [r for r in self.roles if not self.submitted[r]]
        if not roles:
            self.finish("submitted")
        for r in roles:
            if self.pending[r]:  # its observation and the messages it received, as one user turn
                self.views[r].append({"role": "user", "content": "\n\n".join(self.pending[r])})
                self.pending[r] = []
        return roles

    def next_role(self) -> str | None:
        roles = self.next_roles()
        return roles[0] if roles else None

    def on_reply(self, role: str, text: str) -> None:
        self.views[role].append({"role": "assistant", "content": text})
        self.transcript.append({"role": role, "content": text})
        self.turns[role] += 1
        other = self.roles[1 - self.roles.index(role)]
        act = parse_action(text)
        st = self.stats[role]
        if act is None:
            st["malformed"] += 1
            self.pending[role].append("Your reply held no command. Reply with exactly one command in a "
                                      "```bash ... ``` block (or send_message <text>, or submit).")
        elif act[0] == "submit":
            self._submit(role)
        elif act[0] == "message":
            st["messages"] += 1
            self.pending[other].append(f"[Message from {self.names[role]}]: {act[1]}")
            self.pending[role].append("Message sent.")
        else:
            st["commands"] += 1
            r = self.boxes[role].run(act[1])
            self.pending[role].append(f"(exit {r.exit_code}{', timed out' if r.timed_out else ''})\n{r.output}")
        if not self.submitted[role] and self.turns[role] >= self.max_turns:
            self._submit(role)
        if all(self.submitted.values()):
            self.finish("submitted")

    def _submit(self, role: str) -> None:
        self.submitted[role] = True
        self.stats[role]["submit_turn"] = self.turns[role]

    def patch(self, role: str) -> str:
        """The role's submission, taken on the host without reading anything of the workspace's .git."""
        return evaluate.take_patch(self.ws[role], self.gitdirs[role])

    # -- grading --
    def rewards(self) -> dict[str, float]:
        if self.result is None:
            tests = {self.names[r]: self.features[r]["tests_patch"] for r in self.roles}
            try:  # a grade never raises: what cannot be graded (past the bounds, unreadable) fails, with its reason
                patches = {self.names[r]: self.patch(r) for r in self.roles}
                self.result = evaluate.evaluate_pair(
                    self.base_dir, patches, tests,
                    lambda ws: Sandbox(ws,
                                       Limits(wall_seconds=self.test_seconds, workspace_mb=self.limits.workspace_mb),
                                       allow_unsandboxed=self.allow_unsandboxed),
                    wall_seconds=self.test_seconds)
            except Exception as e:  # noqa: BLE001 - recorded in the episode's meta, counted per step
                self.result = evaluate.not_graded(tests, f"{type(e).__name__}: {e}"[:500])
            finally:
                self._remove()
            self._record()
        res = self.result
        out = {}
        for r in self.roles:
            own = res.features[self.names[r]]
            v = 1.0 if res.success else (self.partial_credit if own.ok else 0.0)
            v += self.shaping["applies"] * float(not res.merge.apply_errors)
            v += self.shaping["clean_merge"] * float(res.merge.status == "clean")
            feats = list(res.features.values())
            v += self.shaping["tests"] * (sum(f.fraction for f in feats) / len(feats))
            out[r] = v
        return out

    def _record(self) -> None:
        res = self.result
        assert res is not None  # recorded once the pair is graded
        self.meta["coop"] = {
            "success": res.success, "merge": res.merge.status, "graded": res.merge.status != "not graded",
            "conflicts": res.merge.conflicts,
            "apply_errors": res.merge.apply_errors, "dropped": res.merge.dropped,
            "features": {k: {"ok": f.ok, "passed": f.passed, "failed": f.failed, "errors": f.errors,
                             "note": f.note} for k, f in res.features.items()},
            "messages": {self.names[r]: self.stats[r]["messages"] for r in self.roles},
            "turns_to_submit": {self.names[r]: self.stats[r]["submit_turn"] for r in self.roles},
            "malformed": {self.names[r]: self.stats[r]["malformed"] for r in self.roles}}

    @classmethod
    def step_metrics(cls, episodes: list[Episode]) -> dict[str, float]:
        """From each episode's ``meta.coop``: pair success rate, merge outcomes, messages per episode (both
        coders), turns to submit (mean over coders), malformed replies."""
        cs = [e.meta["coop"] for e in episodes if isinstance(e.meta.get("coop"), dict)]
        if not cs:
            return {}
        n = len(cs)
        turns = [t for c in cs for t in (c.get("turns_to_submit") or {}).values() if t is not None]
        out = {"coop/success_rate": sum(bool(c.get("success")) for c in cs) / n,
               "coop/conflict_rate": sum(bool(c.get("conflicts")) for c in cs) / n,
               "coop/messages_per_episode": sum(sum((c.get("messages") or {}).values()) for c in cs) / n,
               "coop/malformed_per_episode": sum(sum((c.get("malformed") or {}).values()) for c in cs) / n,
               "coop/apply_error_rate": sum(bool(c.get("apply_errors")) for c in cs) / n,
               "coop/not_graded_rate": sum(c.get("graded") is False for c in cs) / n}
        for status in ("clean", "union", "failed"):
            out[f"coop/merge_{status}"] = sum(c.get("merge") == status for c in cs) / n
        if turns:
            out["coop/turns_to_submit"] = sum(turns) / len(turns)
        return out

    def _remove(self) -> None:
        self._cleanup()  # a weakref.finalize: runs once, here, when collected, or at interpreter exit

    # -- tasks --
    @classmethod
    def load_tasks(cls, split: str, data_dir: str | None = None, **_: Any) -> list[Task]:
        from .tasks import load_pairs

        return load_pairs(data_dir, split)
