"""The study's database (SQLModel): sessions, turns, surveys and the assignment cells.

SQLite by default, any SQLAlchemy URL by setting. Every write is its own short transaction, committed
before the app answers. On SQLite every transaction starts with ``BEGIN IMMEDIATE`` (the write lock is
taken at the start, so two arrivals cannot both read the same cell counts); on other databases the
assignment locks the cell rows (``SELECT ... FOR UPDATE``).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Optional

from sqlalchemy import UniqueConstraint, event
from sqlmodel import Field, Session, SQLModel, col, create_engine, select


class Cell(SQLModel, table=True):
    condition: str = Field(primary_key=True)
    task_type: str = Field(primary_key=True)
    n: int = 0


class StudySession(SQLModel, table=True):
    __tablename__ = "study_session"
    __table_args__ = (UniqueConstraint("study_id", "participant_id"),)
    id: str = Field(primary_key=True)
    study_id: str = Field(index=True)
    participant_id: str = Field(index=True)
    external_session_id: str = ""
    condition: str
    task_type: str
    task_id: str
    env: str
    env_options: str = "{}"
    """JSON: the environment options the session ran with (the analysis rebuilds it from them)."""
    status: str = "active"
    """active | ended | surveyed"""
    end_reason: Optional[str] = None
    """participant | transfer | agent_end | turn_cap | env_end | agent_error"""
    user_turns: int = 0
    created_at: float = Field(default_factory=time.time)
    ended_at: Optional[float] = None


class Turn(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("session_id", "idx"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    session_id: str = Field(index=True, foreign_key="study_session.id")
    idx: int
    role: str
    """agent (its exact reply, tool calls included) | user | tool (a call and its result) | system"""
    content: str
    visible: bool = True
    """Shown to the participant (a tool call and its result are not)."""
    kind: str = "message"
    """message | greeting | tool | end | error"""
    meta: str = "{}"
    created_at: float = Field(default_factory=time.time)


class Survey(SQLModel, table=True):
    session_id: str = Field(primary_key=True, foreign_key="study_session.id")
    answers: str
    """JSON: item -> value (Likert 1-7, the P4G donation in dollars)."""
    free_text: str = ""
    created_at: float = Field(default_factory=time.time)


def make_engine(url: str):
    """An engine for ``url``; SQLite gets WAL, a busy timeout and immediate transactions."""
    if url.startswith("sqlite"):
        path = url.split(":///", 1)[1] if ":///" in url else ""
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        eng = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})

        @event.listens_for(eng, "connect")
        def _connect(dbapi_conn, _):
            dbapi_conn.isolation_level = None  # the driver's own BEGIN is off: we issue ours below
            cur = dbapi_conn.cursor()
            if ":memory:" not in url:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(eng, "begin")
        def _begin(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        eng = create_engine(url, pool_pre_ping=True)
    SQLModel.metadata.create_all(eng)
    return eng


def ensure_cells(eng, cells: list[tuple[str, str]]) -> None:
    with Session(eng) as s:
        have = {(c.condition, c.task_type) for c in s.exec(select(Cell)).all()}
        for c, t in cells:
            if (c, t) not in have:
                s.add(Cell(condition=c, task_type=t, n=0))
        s.commit()


def tie_key(participant_id: str, condition: str, task_type: str) -> str:
    """The stable tie-break among equally filled cells: a hash of the participant and the cell."""
    return hashlib.sha256(f"{participant_id}\x00{condition}\x00{task_type}".encode()).hexdigest()


def choose_cell(counts: dict[tuple[str, str], int], participant_id: str) -> tuple[str, str]:
    """The least-filled cell; among equals, the one whose hash with the participant id is smallest."""
    low = min(counts.values())
    return min((k for k, n in counts.items() if n == low), key=lambda k: tie_key(participant_id, *k))


def assign(eng, cells: list[tuple[str, str]], participant_id: str, make_session) -> StudySession:
    """In one transaction: lock the cells, pick the least-filled one, count it and insert the session
    that ``make_session(condition, task_type, n_before)`` builds."""
    from sqlalchemy.exc import OperationalError

    for attempt in range(5):  # a deadlock or serialization failure is retried (the loser's work is rolled back)
        try:
            return _assign(eng, cells, participant_id, make_session)
        except OperationalError as e:
            if attempt == 4 or not any(w in str(e).lower() for w in ("deadlock", "serializ", "locked")):
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable: the last attempt returns or raises")


def _assign(eng, cells, participant_id, make_session) -> StudySession:
    with Session(eng) as s:
        # every arrival locks the cells in the same order, so two never wait on each other in a circle
        rows = s.exec(select(Cell).order_by(Cell.condition, Cell.task_type).with_for_update()).all()
        counts = {(r.condition, r.task_type): r.n for r in rows if (r.condition, r.task_type) in set(cells)}
        cond, tt = choose_cell(counts, participant_id)
        row = next(r for r in rows if (r.condition, r.task_type) == (cond, tt))
        n_before = row.n
        row.n = n_before + 1
        s.add(row)
        sess = make_session(cond, tt, n_before)
        s.add(sess)
        s.commit()
        s.refresh(sess)
        return sess


def add_turns(eng, session_id: str, turns: list[dict[str, Any]], session_update: dict[str, Any] | None = None
              ) -> list[Turn]:
    """Append turns (and update the session) in one transaction; their indices follow the last stored."""
    with Session(eng) as s:
        last = s.exec(select(Turn.idx).where(Turn.session_id == session_id).order_by(col(Turn.idx).desc())).first()
        i = -1 if last is None else last
        out = []
        for t in turns:
            i += 1
            row = Turn(session_id=session_id, idx=i, role=t["role"], content=t["content"],
                       visible=t.get("visible", True), kind=t.get("kind", "message"),
                       meta=json.dumps(t.get("meta", {})))
            s.add(row)
            out.append(row)
        if session_update:
            sess = s.get(StudySession, session_id)
            for k, v in session_update.items():
                setattr(sess, k, v)
            s.add(sess)
        s.commit()
        for r in out:
            s.refresh(r)
        return out


def get_session(eng, session_id: str) -> StudySession | None:
    with Session(eng) as s:
        return s.get(StudySession, session_id)


def stored_session(eng, session_id: str) -> StudySession:
    """The session ``session_id``, which is known to be stored (sessions are never deleted)."""
    sess = get_session(eng, session_id)
    assert sess is not None, session_id
    return sess


def find_session(eng, study_id: str, participant_id: str) -> StudySession | None:
    with Session(eng) as s:
        return s.exec(select(StudySession).where(StudySession.study_id == study_id,
                                                 StudySession.participant_id == participant_id)).first()


def session_turns(eng, session_id: str) -> list[Turn]:
    with Session(eng) as s:
        return list(s.exec(select(Turn).where(Turn.session_id == session_id).order_by(col(Turn.idx))).all())


def update_session(eng, session_id: str, **fields: Any) -> None:
    with Session(eng) as s:
        sess = s.get(StudySession, session_id)
        for k, v in fields.items():
            setattr(sess, k, v)
        s.add(sess)
        s.commit()


def save_survey(eng, session_id: str, answers: dict[str, Any], free_text: str) -> bool:
    """Store the survey and mark the session surveyed; False (nothing written) if one is stored already."""
    from sqlalchemy.exc import IntegrityError

    with Session(eng) as s:
        if s.get(Survey, session_id) is not None:
            return False
        s.add(Survey(session_id=session_id, answers=json.dumps(answers), free_text=free_text))
        sess = s.get(StudySession, session_id)
        assert sess is not None, session_id  # a survey is only taken for a stored session
        sess.status = "surveyed"
        s.add(sess)
        try:
            s.commit()
        except IntegrityError:  # a concurrent submission won (databases without immediate transactions)
            return False
        return True


def get_survey(eng, session_id: str) -> Survey | None:
    with Session(eng) as s:
        return s.get(Survey, session_id)


def cell_counts(eng) -> dict[tuple[str, str], int]:
    with Session(eng) as s:
        return {(c.condition, c.task_type): c.n for c in s.exec(select(Cell)).all()}


def all_rows(eng) -> tuple[list[StudySession], list[Turn], list[Survey]]:
    with Session(eng) as s:
        return (list(s.exec(select(StudySession).order_by(col(StudySession.created_at))).all()),
                list(s.exec(select(Turn).order_by(col(Turn.session_id), col(Turn.idx))).all()),
                list(s.exec(select(Survey)).all()))


EXPORTS = ("sessions", "turns", "surveys")


def csv_text(eng, table: str) -> str:
    """One table (``EXPORTS``) as CSV, every column."""
    import csv
    import io

    sessions, turns, surveys = all_rows(eng)
    tables: dict[str, list[Any]] = {"sessions": sessions, "turns": turns, "surveys": surveys}
    rows = tables[table]
    models: dict[str, type[SQLModel]] = {"sessions": StudySession, "turns": Turn, "surveys": Survey}
    cols = list(models[table].model_fields)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(cols)
    for r in rows:
        w.writerow([safe_cell(getattr(r, c)) for c in cols])
    return buf.getvalue()


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(v: Any) -> Any:
    """A text cell that a spreadsheet would read as a formula (it starts with =, +, -, @, a tab or a carriage
    return: participants' free text and chat turns) gets a leading ' (OWASP's CSV-injection guidance);
    numbers stay numbers."""
    return "'" + v if isinstance(v, str) and v.startswith(FORMULA_START) else v
