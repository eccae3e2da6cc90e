"""Environment-simulation samples from scope's exact tau2 tools: for one tool call, the state it reads (a slice
of the database: the records the exact tool touched), the call, what the tool answers and what it changes.

Built by replaying a task's gold actions on a fresh database (each call a sample, the calls before it its
history), by calls whose ids are replaced with ones that do not exist (failures), and by reads of other
records (no change). Every sample is checked: the call made on its slice alone gives the same answer and
the same changes as on the whole database. A sample whose slice holds more than ``max_records`` records
(a search over every flight of a day, say) is left out: no prompt would hold it.
"""
from __future__ import annotations

import copy
import json
import random
from typing import Any, Iterator

from ..envs.tau2.db import OverlayDB
from ..envs.tau2.tools import DOMAINS, call_tool
from ..envs.tau2.tooling import ToolError
from .state import canon, diff, size


class TrackingDB(OverlayDB):
    """An OverlayDB that remembers every record a call looks at or writes."""

    def __init__(self, base, upstream_quirks: bool = True):
        super().__init__(base, upstream_quirks)
        self.touched: set[tuple[str, str]] = set()

    def has(self, table, key):
        self.touched.add((table, key))
        return super().has(table, key)

    def get(self, table, key):
        self.touched.add((table, key))
        return super().get(table, key)

    def mut(self, table, key):
        self.touched.add((table, key))
        return super().mut(table, key)

    def put(self, table, key, value):
        self.touched.add((table, key))
        super().put(table, key, value)

    def keys(self, table):
        for k in super().keys(table):
            self.touched.add((table, k))
            yield k


def _value(db: OverlayDB, table: str, key: str) -> Any:
    return copy.deepcopy(db.get(table, key)) if db.has(table, key) else None


def slice_db(db: OverlayDB, keys: set[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for t, k in sorted(keys):
        if OverlayDB.has(db, t, k):
            out.setdefault(t, {})[k] = copy.deepcopy(OverlayDB.get(db, t, k))
    return out


def result_text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)


def run_call(domain: str, db: OverlayDB, name: str, args: dict) -> dict[str, Any]:
    """Run one call on ``db`` (changed in place) and return its sample fields: the slice before and after,
    the answer (``Error: ...`` for a refused call) and the changes."""
    tdb = TrackingDB(db.base, db.upstream_quirks)
    tdb.over = db.over  # the same state; the tracker only watches
    before = copy.deepcopy(db.over)
    failure = False
    try:
        feedback = result_text(call_tool(domain, tdb, name, args))
    except ToolError as e:
        feedback, failure = f"Error: {e}", True
    touched = tdb.touched
    snap = OverlayDB(db.base, db.upstream_quirks)
    snap.over = before
    s0, s1 = slice_db(snap, touched), slice_db(db, touched)
    return {"state": s0, "next_state": s1, "feedback": feedback, "changes": diff(s0, s1),
            "failure": failure, "records": sum(len(v) for v in s0.values())}


def check_slice(domain: str, base: dict, sample: dict[str, Any], upstream_quirks: bool = True) -> bool:
    """The call made on the sample's slice alone gives the sample's answer and changes."""
    tables = {t: dict(sample["state"].get(t, {})) for t in base}
    db = OverlayDB(tables, upstream_quirks)
    try:
        feedback = result_text(call_tool(domain, db, sample["tool"], sample["arguments"]))
    except ToolError as e:
        feedback = f"Error: {e}"
    after = {t: {k: db.get(t, k) for k in recs} for t, recs in sample["state"].items()}
    for t, recs in db.over.items():  # records the call added
        for k, v in recs.items():
            after.setdefault(t, {})[k] = v
    after = {t: v for t, v in after.items() if v}
    got = sorted(canon(c) for c in diff(sample["state"], after))
    return feedback == sample["feedback"] and got == sorted(canon(c) for c in sample["changes"])


BAD_IDS = {"order_id": "#W0000000", "user_id": "nobody_0000", "reservation_id": "ZZZ000",
           "payment_method_id": "credit_card_0000000", "product_id": "0000000000", "item_id": "0000000000"}


def gold_samples(domain: str, data: dict, max_records: int = 12) -> Iterator[dict[str, Any]]:
    """Every gold action of every task, in order on a fresh database (the calls before it are its history),
    and for each call with an id argument, the same call with a made-up id (a failure)."""
    for tid, task in data["tasks"].items():
        actions = (task.get("evaluation_criteria") or {}).get("actions") or []
        db = OverlayDB(data["db"])
        history: list[dict[str, Any]] = []
        for step, a in enumerate(actions):
            name, args = a["name"], dict(a.get("arguments") or {})
            if name not in DOMAINS[domain]:
                continue
            for arg, bad in BAD_IDS.items():  # a failure: the id does not exist (on a copy: db is untouched)
                if arg in args:
                    trial = OverlayDB(data["db"])
                    trial.over = copy.deepcopy(db.over)
                    s = run_call(domain, trial, name, {**args, arg: bad})
                    if s["failure"]:
                        yield {"id": f"{domain}/{tid}/{step}/bad_{arg}", "domain": domain, "tool": name,
                               "arguments": {**args, arg: bad}, "history": list(history), **s}
                    break
            s = run_call(domain, db, name, args)
            if s["records"] <= max_records:
                yield {"id": f"{domain}/{tid}/{step}", "domain": domain, "tool": name, "arguments": args,
                       "history": list(history), **s}
            history.append({"tool": name, "arguments": args, "feedback": s["feedback"][:500]})


def read_samples(domain: str, data: dict, n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Reads of random records of the fresh database (no change; one argument), and the domain's calls
    without arguments."""
    rng = random.Random(seed)
    db = data["db"]
    reads = {"retail": [("get_user_details", "user_id", "users"), ("get_order_details", "order_id", "orders"),
                        ("get_product_details", "product_id", "products")],
             "airline": [("get_user_details", "user_id", "users"),
                         ("get_reservation_details", "reservation_id", "reservations")]}[domain]
    for i in range(n):
        name, arg, table = reads[i % len(reads)]
        key = rng.choice(sorted(db[table]))
        s = run_call(domain, OverlayDB(db), name, {arg: key})
        yield {"id": f"{domain}/read/{i}", "domain": domain, "tool": name, "arguments": {arg: key}, "history": [],
               **s}
    for name, tool in DOMAINS[domain].items():
        if not tool.required and not tool.params:
            s = run_call(domain, OverlayDB(db), name, {})
            if s["records"] <= 12:
                yield {"id": f"{domain}/noarg/{name}", "domain": domain, "tool": name, "arguments": {},
                       "history": [], **s}


def axes(sample: dict[str, Any]) -> dict[str, str]:
    """The difficulty axes of a sample: changed fields (0, 1, 2, 3+), read or write, history length."""
    n = size(sample["changes"])
    kind = DOMAINS[sample["domain"]][sample["tool"]].kind
    h = len(sample["history"])
    return {"changes": "3+" if n >= 3 else str(n), "kind": "write" if kind == "write" else "read",
            "history": "0" if h == 0 else "1-2" if h <= 2 else "3+",
            "failure": "failure" if sample["failure"] else "ok"}


ADDRESS = ("address1", "address2", "city", "state", "country", "zip")
NEW = {"address1": "12 Elm Street", "address2": "Suite 4", "city": "Springfield", "state": "OR",
       "country": "USA", "zip": "97403"}


def small_write_samples(domain: str, data: dict, n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Writes that change one or two fields: an address with one or two of its fields new (retail: a user's
    or a pending order's), a reservation's passengers with one or two names changed (airline)."""
    rng = random.Random(seed)
    db = data["db"]
    for i in range(n):
        k = 1 + i % 2  # fields to change
        if domain == "retail":
            if i % 4 < 2:
                name, table, arg = "modify_user_address", "users", "user_id"
                key = rng.choice(sorted(db[table]))
                addr = db[table][key]["address"]
            else:
                name, table, arg = "modify_pending_order_address", "orders", "order_id"
                key = rng.choice(sorted(o for o, v in db["orders"].items() if v["status"] == "pending"))
                addr = db[table][key]["address"]
            fields = rng.sample(ADDRESS, k)
            args = {arg: key, **{f: (NEW[f] if f in fields else addr.get(f, "")) for f in ADDRESS}}
        else:
            name = "update_reservation_passengers"
            key = rng.choice(sorted(r for r, v in db["reservations"].items() if len(v["passengers"]) >= k))
            pax = [dict(p) for p in db["reservations"][key]["passengers"]]
            for j in range(k):
                pax[j]["first_name"] = pax[j]["first_name"] + "a"
            args = {"reservation_id": key, "passengers": pax}
        s = run_call(domain, OverlayDB(db), name, args)
        if not s["failure"] and s["records"] <= 12:
            yield {"id": f"{domain}/small/{i}", "domain": domain, "tool": name, "arguments": args, "history": [], **s}


STRATA = {"failure": 20, "0": 80, "1": 50, "2": 50, "3-6": 150, "7+": 50}
"""The benchmark's composition by changed fields (EnvSimBench's shape, with 1 and 2 apart for the cliff)."""


def stratum(sample: dict[str, Any]) -> str:
    if sample["failure"]:
        return "failure"
    n = size(sample["changes"])
    return str(n) if n <= 2 else "3-6" if n <= 6 else "7+"


def candidates(data_by_domain: dict[str, dict], seed: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for domain, data in data_by_domain.items():
        out += list(gold_samples(domain, data))
        out += list(read_samples(domain, data, 60, seed))
        out += list(small_write_samples(domain, data, 80, seed))
    return out


def select(cands: list[dict[str, Any]], strata: dict[str, int] = STRATA, seed: int = 0) -> list[dict[str, Any]]:
    """The benchmark: per stratum, up to its quota, drawn (seeded) across both domains and every tool."""
    rng = random.Random(seed)
    by: dict[str, list[dict[str, Any]]] = {}
    for s in cands:
        by.setdefault(stratum(s), []).append(s)
    out = []
    for name, quota in strata.items():
        pool = sorted(by.get(name, []), key=lambda s: s["id"])
        rng.shuffle(pool)
        pool.sort(key=lambda s: (s["tool"], s["domain"]))  # round-robin over tools: no tool floods a stratum
        tools: dict[str, list[dict[str, Any]]] = {}
        for s in pool:
            tools.setdefault(f"{s['domain']}/{s['tool']}", []).append(s)
        queues = [tools[t] for t in sorted(tools)]
        picked: list[dict[str, Any]] = []
        while len(picked) < quota and any(queues):
            for q in queues:
                if q and len(picked) < quota:
                    picked.append(q.pop(0))
        out += picked
    return out
