"""Cooperative-coding tasks in CooperBench's layout: every pair of features of a task is one scope Task.

    <data_dir>/<repo>_task/task<N>/
        repo/                   the base repository at its base commit (CooperBench's setup.sh checks it
                                out from BASE_COMMIT; here it must be on disk: nothing is downloaded)
        combined.patch          optional: all the task's features implemented together (coordinated)
        feature<k>/feature.md   what the agent implementing feature k is told
        feature<k>/feature.patch   a reference implementation of feature k alone
        feature<k>/tests.patch     feature k's hidden tests

``<data_dir>/splits.json`` (optional) maps a split name to task directories (``<repo>_task/task<N>``) or
pair ids; without it every pair is in every split. The suite scope ships (``suite/``, made by
``tools/make_coop_suite.py``) is the default ``data_dir``.
"""
from __future__ import annotations

import itertools
import json
import os
import re

from ...types import Task

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def load_task_dir(path: str) -> dict:
    """One task directory: its base repository and its features (in feature-number order)."""
    repo = os.path.join(path, "repo")
    if not os.path.isdir(repo):
        raise FileNotFoundError(f"{path}: no repo/ directory (the base repository at the task's base commit; "
                                f"check it out there)")
    feats = []
    for name in sorted((d for d in os.listdir(path) if re.fullmatch(r"feature\d+", d)), key=lambda d: int(d[7:])):
        fd = os.path.join(path, name)
        missing = [f for f in ("feature.md", "tests.patch") if not os.path.exists(os.path.join(fd, f))]
        if missing:
            raise FileNotFoundError(f"{fd}: missing {', '.join(missing)}")
        ref = os.path.join(fd, "feature.patch")
        feats.append({"name": name, "description": _read(os.path.join(fd, "feature.md")),
                      "tests_patch": _read(os.path.join(fd, "tests.patch")),
                      "reference_patch": _read(ref) if os.path.exists(ref) else None})
    if len(feats) < 2:
        raise ValueError(f"{path}: a cooperative task needs at least two features, found {len(feats)}")
    combined = os.path.join(path, "combined.patch")
    return {"repo_dir": repo, "features": feats,
            "combined_patch": _read(combined) if os.path.exists(combined) else None}


def task_dirs(data_dir: str) -> list[str]:
    out = []
    for repo in sorted(os.listdir(data_dir)):
        rd = os.path.join(data_dir, repo)
        if not (repo.endswith("_task") and os.path.isdir(rd)):
            continue
        for t in sorted(os.listdir(rd), key=lambda s: (len(s), s)):
            if re.fullmatch(r"task\d+", t) and os.path.isdir(os.path.join(rd, t)):
                out.append(f"{repo}/{t}")
    return out


def load_pairs(data_dir: str | None, split: str) -> list[Task]:
    data_dir = data_dir or SUITE
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"coop_coding: data_dir {data_dir!r} is not a directory")
    dirs = task_dirs(data_dir)
    if not dirs:
        raise FileNotFoundError(f"coop_coding: no <repo>_task/task<N> directories under {data_dir}")
    sp_path = os.path.join(data_dir, "splits.json")
    chosen = None
    if os.path.exists(sp_path):
        splits = json.load(open(sp_path))
        if split not in splits:
            raise ValueError(f"coop_coding: split {split!r} is not in {sp_path} (has {sorted(splits)})")
        chosen = set(splits[split])
    tasks = []
    for rel in dirs:
        t = load_task_dir(os.path.join(data_dir, rel))
        for a, b in itertools.combinations(range(len(t["features"])), 2):
            fa, fb = t["features"][a], t["features"][b]
            tid = f"{rel}/{fa['name']}-{fb['name']}"
            if chosen is not None and rel not in chosen and tid not in chosen:
                continue
            tasks.append(Task(id=tid, split=split, data={"repo_dir": t["repo_dir"], "features": [fa, fb],
                                                         "combined_patch": t["combined_patch"]}))
    if not tasks:
        raise ValueError(f"coop_coding: split {split!r} of {data_dir} holds no feature pairs")
    return tasks
