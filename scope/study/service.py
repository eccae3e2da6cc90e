"""What the study app does, apart from HTTP: start or resume a session, run its turns, end it, take
its survey. Every turn is committed to the database before anything about it is sent back.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from . import store
from .agents import StudyAgent, TaskBank, env_seed
from .config import StudyConfig, kind_of
from .survey import SURVEYS, check_answers

MAX_AGENT_STEPS = 12
"""Agent replies in a row (tool calls and their results) before the session is ended as an error."""
AGENT_RETRIES = 2
TAU2_STOP, TAU2_TRANSFER = "###STOP###", "###TRANSFER###"


class StudyError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Runtime:
    env: Any
    lock: threading.RLock = field(default_factory=threading.RLock)


def sign(secret: bytes, label: str, session_id: str) -> str:
    return hmac.new(secret, f"{label}:{session_id}".encode(), hashlib.sha256).hexdigest()


class StudyService:
    def __init__(self, cfg: StudyConfig, engine, agents: dict[tuple[str, str], StudyAgent], bank: TaskBank,
                 secret: bytes):
        self.cfg, self.engine, self.agents, self.bank, self.secret = cfg, engine, agents, bank, secret
        self.runtimes: OrderedDict[str, Runtime] = OrderedDict()  # least recently used first
        self.runtimes_lock = threading.Lock()
        self.in_flight: set[str] = set()  # sessions whose message is being answered (under runtimes_lock)
        store.ensure_cells(engine, cfg.cells())

    # ---- identity -------------------------------------------------------------------------------
    def token(self, session_id: str) -> str:
        return sign(self.secret, "owner", session_id)

    def completion_code(self, session_id: str) -> str:
        return sign(self.secret, "complete", session_id)[:12].upper()

    def check_owner(self, session_id: str, token: str | None) -> store.StudySession:
        sess = store.get_session(self.engine, session_id) if len(session_id) <= 64 else None
        if sess is None or not token or not hmac.compare_digest(token.encode(), self.token(session_id).encode()):
            raise StudyError(404, "no such session (or not yours)")  # one answer for both: ids stay unprobed
        return sess

    # ---- start / resume ----------------------------------------------------------------------------
    def start(self, participant_id: str, study_id: str, external_session_id: str) -> store.StudySession:
        if study_id != self.cfg.study.id:  # a link made for another study fills no cell of this one
            raise StudyError(404, "this study link is not for the study this server runs")
        old = store.find_session(self.engine, study_id, participant_id)
        if old is not None:
            if old.external_session_id != external_session_id:
                raise StudyError(409, "this participant already has a session in this study")
            return old

        def make(cond: str, tt: str, n: int) -> store.StudySession:
            task = self.bank.pick(tt, n)
            agent = self.agents[(cond, tt)]
            return store.StudySession(id=secrets.token_urlsafe(18), study_id=study_id,
                                      participant_id=participant_id, external_session_id=external_session_id,
                                      condition=cond, task_type=tt, task_id=task.id, env=agent.task_type.env,
                                      env_options=json.dumps(agent.options, sort_keys=True, default=str))

        from sqlalchemy.exc import IntegrityError

        try:
            sess = store.assign(self.engine, self.cfg.cells(), participant_id, make)
        except IntegrityError:  # the same participant arrived twice at once: the first one won
            found = store.find_session(self.engine, study_id, participant_id)
            if found is None or found.external_session_id != external_session_id:
                raise StudyError(409, "this participant already has a session in this study") from None
            return found
        if kind_of(sess.env) == "tau2":  # the agent's greeting opens the chat, as in the environment
            from ..envs.tau2.env import GREETING

            store.add_turns(self.engine, sess.id, [{"role": "agent", "content": GREETING, "kind": "greeting"}])
        return sess

    # ---- the live environment ----------------------------------------------------------------------
    @contextmanager
    def held(self, sess: store.StudySession) -> Iterator[tuple[Runtime, store.StudySession]]:
        """The session's environment with its lock held, and the session as stored now. The environment of
        an active session is rebuilt from the stored turns when this process does not hold it (a restart,
        or it was evicted).
        Once the session has ended its environment is dropped; beyond ``study.max_live_sessions``, the
        least recently used idle ones are dropped too (rebuilt if their participant comes back)."""
        while True:
            with self.runtimes_lock:
                rt = self.runtimes.get(sess.id)
                if rt is None:
                    rt = self.runtimes[sess.id] = Runtime(env=None)
                self.runtimes.move_to_end(sess.id)
                self._evict_idle()
            with rt.lock:
                if self.runtimes.get(sess.id) is not rt:  # evicted while this thread waited: take the new one
                    continue
                now = store.stored_session(self.engine, sess.id)
                if rt.env is None and now.status == "active":  # (an ended session's is never needed again)
                    rt.env = self.rebuild(now, store.session_turns(self.engine, sess.id))
                try:
                    yield rt, now
                finally:
                    if store.stored_session(self.engine, sess.id).status != "active":
                        with self.runtimes_lock:
                            if self.runtimes.get(sess.id) is rt:
                                del self.runtimes[sess.id]
                return

    def _evict_idle(self) -> None:
        """(runtimes_lock held) Drop the least recently used environments nobody is using, down to the cap."""
        over = len(self.runtimes) - self.cfg.study.max_live_sessions
        for sid in list(self.runtimes)[:-1]:  # never the one just asked for (last)
            if over <= 0:
                return
            rt = self.runtimes[sid]
            if rt.lock.acquire(blocking=False):
                try:
                    del self.runtimes[sid]
                    over -= 1
                finally:
                    rt.lock.release()

    def rebuild(self, sess: store.StudySession, turns: list[store.Turn]):
        agent = self.agents[(sess.condition, sess.task_type)]
        env = agent.new_env(self.bank.get(sess.task_type, sess.task_id), env_seed(sess.id))
        replay(env, turns)
        return env

    def _agent_loop(self, sess: store.StudySession, rt: Runtime, emit=None) -> tuple[_Events, dict]:
        """Let the agent speak until it is the participant's turn; every reply is stored whole when it ends.
        Returns the events to show and the session's new fields. With ``emit``, each event is also passed to
        it as it happens, and the agent's words as they are generated (``delta`` events; never the text of a
        tool call or an end marker)."""
        env, agent = rt.env, self.agents[(sess.condition, sess.task_type)]
        events = _Events(emit)
        update, steps = {}, 0
        while not env.done and env.next_role() == "agent":
            steps += 1
            if steps > MAX_AGENT_STEPS:
                update = self._ended("agent_error")
                store.add_turns(self.engine, sess.id, [{"role": "system", "content": "the agent kept calling tools "
                                f"({MAX_AGENT_STEPS} replies in a row)", "visible": False, "kind": "error"}], update)
                events.append({"type": "end", "reason": "agent_error"})
                return events, update
            text, err = None, None
            for _ in range(AGENT_RETRIES + 1):
                live = _LiveText(emit, hide=(TAU2_STOP, "<tool_call")) if emit is not None else None
                try:
                    text = agent.reply(env, on_text=live)
                    break
                except Exception as e:  # noqa: BLE001 - recorded; the session ends instead of hanging
                    err = f"{type(e).__name__}: {e}"
            if text is None:
                update = self._ended("agent_error")
                store.add_turns(self.engine, sess.id, [{"role": "system", "content": f"agent failed: {err}"[:2000],
                                                        "visible": False, "kind": "error"}], update)
                events.append({"type": "end", "reason": "agent_error"})
                return events, update
            turns, shown = apply_agent(env, text)
            if env.done:
                update = self._ended("agent_end" if getattr(env, "ended_by", None) == "agent" else "env_end")
            last = turns[-1]
            if last.get("kind") == "tool" and last["meta"].get("name") == "transfer_to_human_agents" \
                    and not last["meta"].get("error") and not env.done:
                env.on_reply("partner", TAU2_TRANSFER)  # as tau2's user simulator does after a transfer
                turns.append({"role": "user", "content": TAU2_TRANSFER, "visible": False, "kind": "end",
                              "meta": {"reason": "transfer"}})
                update = self._ended("transfer")
            store.add_turns(self.engine, sess.id, turns, update or None)
            if shown is not None:
                events.append({"type": "message", "role": "agent", "text": shown})
            elif turns[0].get("kind") == "tool_call":
                events.append({"type": "status", "text": "The agent is looking something up..."})
            if update:
                events.append({"type": "end", "reason": update["end_reason"]})
        return events, update

    def _ended(self, reason: str) -> dict:
        return {"status": "ended", "end_reason": reason, "ended_at": time.time()}

    def catch_up(self, sess: store.StudySession) -> list[dict]:
        """Run the agent where it owes a reply (a new P4G session; a reply lost to a restart; a King of the
        Hill game, played whole)."""
        with self.held(sess) as (rt, sess):
            if sess.status != "active":
                return []
            events, update = self._agent_loop(sess, rt)
            if sess.env == "koth" and rt.env.done:  # the game is over: keep its replay, end the session
                end = {} if update else self._ended("env_end")
                meta = {"frames": rt.env.frames, "result": rt.env.rewards()["agent"],
                        "score": rt.env.frames[-1]["score"] if rt.env.frames else [0, 0]}
                store.add_turns(self.engine, sess.id, [{"role": "system", "content": "the game's replay",
                                                        "visible": False, "kind": "replay", "meta": meta}],
                                end or None)
                if end:
                    events.append({"type": "end", "reason": "env_end"})
            return events

    # ---- the participant's actions -------------------------------------------------------------------
    def check_message(self, text: str) -> str:
        """The participant's message, stripped; a 4xx StudyError for an empty or over-long one."""
        text = _clean_text((text or "").strip(), "message")
        if not text:
            raise StudyError(400, "empty message")
        if len(text) > self.cfg.study.max_message_chars:
            raise StudyError(413, f"message over {self.cfg.study.max_message_chars} characters")
        return text

    def message(self, sess: store.StudySession, text: str, emit=None, claimed: bool = False) -> list[dict]:
        """The participant's message, then the agent's replies. Returns the events; with ``emit`` each is
        also passed to it as it happens (the agent's words while they are generated). ``claimed``: the caller
        already holds the session's place (:meth:`claim`), released here."""
        text = self.check_message(text)
        if sess.env == "koth":
            raise StudyError(409, "this session has no chat: it shows a game")
        if text.lower() == "/stop":
            return self.end(sess)
        if not claimed:
            self.claim(sess)
        try:
            return self._answer(sess, text, emit)
        finally:
            self.release(sess)

    def claim(self, sess: store.StudySession) -> None:
        """Hold the session's one place for a message being answered, or refuse the message whole: 409 while its
        previous one is answered, 429 when ``study.max_in_flight`` messages are (nothing of it is stored)."""
        with self.runtimes_lock:
            if sess.id in self.in_flight:
                raise StudyError(409, "your previous message is still being answered: wait for its reply")
            if len(self.in_flight) >= self.cfg.study.max_in_flight:
                raise StudyError(429, "busy: too many messages are being answered, try again in a moment")
            self.in_flight.add(sess.id)

    def release(self, sess: store.StudySession) -> None:
        with self.runtimes_lock:
            self.in_flight.discard(sess.id)

    def _answer(self, sess: store.StudySession, text: str, emit=None) -> list[dict]:
        with self.held(sess) as (rt, sess):
            if sess.status != "active":
                raise StudyError(409, "this chat has ended")
            events, _ = self._agent_loop(sess, rt, emit)  # a reply owed from before (a restart in the middle)
            sess = store.stored_session(self.engine, sess.id)
            if sess.status != "active":
                return events
            cap = self.cfg.tasks[sess.task_type].turn_cap()
            n = sess.user_turns + 1
            store.add_turns(self.engine, sess.id, [{"role": "user", "content": text}], {"user_turns": n})
            rt.env.on_reply("partner", text)  # (stored first: a crash here is replayed on the next visit)
            if rt.env.done:  # the participant's words ended it (tau2 stop words, a P4G marker or its turn cap)
                update = self._ended({"user_stop": "participant", "max_turns": "turn_cap"}.get(
                    rt.env.end_reason, "env_end"))
                store.update_session(self.engine, sess.id, **update)
                events.append({"type": "end", "reason": update["end_reason"]})
                return list(events)
            more, upd = self._agent_loop(sess, rt, emit)
            events.extend(more, emitted=True)
            if not upd and n >= cap:
                upd = self._ended("turn_cap")
                store.update_session(self.engine, sess.id, **upd)
                events.append({"type": "end", "reason": "turn_cap"})
            return list(events)

    def end(self, sess: store.StudySession) -> list[dict]:
        """The participant ends the chat (the End button, or /stop)."""
        with self.held(sess) as (rt, sess):
            if sess.status != "active":
                return []
            update = self._ended("participant")
            if kind_of(sess.env) == "tau2":  # the user ends the dialogue (graded as tau2 grades a user stop)
                rt.env.on_reply("partner", TAU2_STOP)
                turn = {"role": "user", "content": TAU2_STOP, "visible": False, "kind": "end",
                        "meta": {"reason": "participant"}}
            else:
                turn = {"role": "system", "content": "the participant ended the chat", "visible": False,
                        "kind": "end"}
            store.add_turns(self.engine, sess.id, [turn], update)
            return [{"type": "end", "reason": "participant"}]

    def survey(self, sess: store.StudySession, answers: Any, free_text: Any) -> dict:
        if sess.status == "active":
            raise StudyError(409, "end the chat before the survey")
        kind = kind_of(sess.env)
        if free_text is None:
            free_text = ""
        if not isinstance(free_text, str):
            raise StudyError(400, "free_text must be text")
        free_text = _clean_text(free_text, "free_text")
        if len(free_text) > self.cfg.study.max_text_chars:
            raise StudyError(413, f"free text over {self.cfg.study.max_text_chars} characters")
        clean = check_answers(kind, answers)
        if isinstance(clean, str):
            raise StudyError(400, clean)
        store.save_survey(self.engine, sess.id, clean, free_text)  # a second submission changes nothing
        return self.completion(sess.id)

    def completion(self, session_id: str) -> dict:
        code = self.completion_code(session_id)
        return {"code": code, "redirect": self.cfg.study.completion_url.replace("{code}", code)}

    # ---- what the page shows --------------------------------------------------------------------------
    def state(self, sess: store.StudySession) -> dict:
        sess = store.stored_session(self.engine, sess.id)
        turns = store.session_turns(self.engine, sess.id)
        kind = kind_of(sess.env)
        messages = [{"role": "agent" if t.role == "agent" else "user", "text": display(t)}
                    for t in turns if t.visible and t.role in ("agent", "user")]
        out = {"session": sess.id, "kind": kind, "status": sess.status, "end_reason": sess.end_reason,
               "turn_cap": self.cfg.tasks[sess.task_type].turn_cap(), "user_turns": sess.user_turns,
               "max_message_chars": self.cfg.study.max_message_chars, "task": self.task_panel(sess),
               "messages": messages, "survey": SURVEYS[kind]}
        if kind == "koth":
            rec = next((t for t in turns if t.kind == "replay"), None)
            out["replay"] = json.loads(rec.meta) if rec is not None else None
        if sess.status == "surveyed":
            out["completion"] = self.completion(sess.id)
        return out

    def task_panel(self, sess: store.StudySession) -> dict:
        task = self.bank.get(sess.task_type, sess.task_id)
        if sess.env == "koth":
            return {"kind": "koth", "title": "Watch one game",
                    "intro": "Two teams of two play King of the Hill: a team scores a point each moment one of its "
                             "units stands on the grey hill while no enemy does; two units that meet send the one "
                             "with fewer teammates nearby back to its start. Watch the blue team, then say how it "
                             "played.", "card": []}
        if sess.env == "p4g":
            from ..data.p4g import persona_text

            return {"kind": "p4g", "title": "Your role",
                    "intro": "Imagine you are this person. You have just earned $2 for a task. Someone will chat "
                             "with you; reply as this person would. At the end you will say how much of the $2, "
                             "if any, you would donate.",
                    "card": persona_text(task.data).split("\n")}
        sc = task.data["task"].get("user_scenario") or {}
        ins = sc.get("instructions") or {}
        if isinstance(ins, str):
            ins = {"task_instructions": ins}
        fields = [("Who you are", sc.get("persona")), ("Why you are contacting support", ins.get("reason_for_call")),
                  ("What you know", ins.get("known_info")), ("What you do not know", ins.get("unknown_info")),
                  ("How to behave", ins.get("task_instructions"))]
        return {"kind": "tau2", "title": f"Your situation ({sess.env.split('_')[1]} customer support)",
                "intro": "You are the customer. Explain your situation to the support agent and get it resolved. "
                         "Use only the details below; if you do not know something, say so.",
                "fields": [{"label": k, "text": str(v)} for k, v in fields if v]}


class _Events(list):
    """A list of events that also hands each one to ``emit`` as it is appended (when there is one)."""

    def __init__(self, emit=None):
        super().__init__()
        self.emit = emit

    def append(self, ev: dict) -> None:
        super().append(ev)
        if self.emit is not None:
            self.emit(ev)

    def extend(self, evs, emitted: bool = False) -> None:  # events already emitted by a nested loop
        for ev in evs:
            super().append(ev) if emitted else self.append(ev)


class _LiveText:
    """Turns "text so far" callbacks into ``delta`` events. It holds back what may turn out not to be for the
    participant: once the text holds one of ``hide`` (a tool call, an end marker) nothing more is shown, and
    a tail that could be the start of one waits until it cannot. The stored turn is what counts: the
    ``message`` event that follows replaces the streamed text."""

    def __init__(self, emit, hide: tuple[str, ...]):
        self.emit, self.hide, self.sent, self.stopped = emit, hide, 0, False

    def __call__(self, text: str) -> None:
        if self.stopped:
            return
        cut = min((text.find(h) for h in self.hide if h in text), default=-1)
        if cut >= 0:
            self.stopped, upto = True, cut
        else:
            upto = len(text)
            for h in self.hide:  # the longest tail that is a prefix of a hidden marker waits
                for k in range(min(len(h) - 1, len(text)), 0, -1):
                    if text.endswith(h[:k]):
                        upto = min(upto, len(text) - k)
                        break
        if upto > self.sent:
            self.emit({"type": "delta", "text": text[self.sent:upto]})
            self.sent = upto


# ---- turns <-> environment ------------------------------------------------------------------------------
def replay(env, turns: list[store.Turn]) -> None:
    """Re-apply stored turns to a fresh environment (greetings and tool rows come from the env itself)."""
    for t in turns:
        if t.kind in ("greeting", "tool", "error") or t.role == "system":
            continue
        if env.done:
            break
        env.on_reply("agent" if t.role == "agent" else "partner", t.content)


def apply_agent(env, text: str) -> tuple[list[dict], str | None]:
    """Apply one agent reply; return the turns to store and the text the participant sees (None if none)."""
    n = len(env.transcript)
    env.on_reply("agent", text)
    if not getattr(env, "chat", True):  # commands, not words (King of the Hill's skill picks): kept, not shown
        return [{"role": "agent", "content": text, "visible": False, "kind": "command"}], None
    new = env.transcript[n:]
    if new and new[-1]["role"] == "tool":  # tau2: a tool call and its result, not shown
        meta: dict[str, Any] = {"entry": new[-1]["content"]}
        from ..envs.tau2.env import parse_tool_call

        name, args, err = parse_tool_call(text)
        res = env.views["agent"][-1]["content"]
        meta.update(name=name, arguments=args, result=res.removeprefix("<tool_result>").removesuffix("</tool_result>"))
        if err is not None or meta["result"].startswith("Error:"):
            meta["error"] = err or meta["result"]
        return [{"role": "agent", "content": text, "visible": False, "kind": "tool_call"},
                {"role": "tool", "content": new[-1]["content"], "visible": False, "kind": "tool", "meta": meta}], None
    shown = text.replace(TAU2_STOP, "").strip() if getattr(env, "agent_stop", False) else text.strip()
    return [{"role": "agent", "content": text}], shown


def display(t: store.Turn) -> str:
    return t.content.replace(TAU2_STOP, "").strip() if t.role == "agent" else t.content


def _clean_text(text: str, what: str) -> str:
    """``text`` if it can be stored and sent as UTF-8; a 400 for text that cannot (a lone surrogate such as
    ``\\ud800``, which JSON can carry), before anything is stored."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise StudyError(400, f"{what}: not valid text (an unpaired surrogate)") from None
    return text
