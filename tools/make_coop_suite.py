"""Write scope's cooperative-coding suite (scope/envs/coop/suite/) in CooperBench's layout.

Four small Python repositories, four features each (every pair of features of a repository is a task:
24 pairs). Each feature has a description, a reference patch and hidden tests; each repository has a
combined patch with all four features written together. Feature pairs range from disjoint edits (a
clean merge) and appends at the same place (a conflict that a union merge resolves) to two features that
rewrite the same lines (a conflict whose union merge is broken code, so that only coordination passes).
What each reference pair's merge gives is not written by hand: this script grades every pair through
scope's own pipeline and records the outcome in ``pairs.json`` (the suite's tests check it again). The
repositories, features and tests are files under ``tools/coop_suite_src/`` (see ``SRC``).

    python tools/make_coop_suite.py [--out scope/envs/coop/suite]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "coop_suite_src")
"""The suite's sources, as files: ``<repo>/base/`` (the base repository), ``<repo>/combined/`` (every
feature written together), ``<repo>/feature<k>/{feature.md, files/, tests/}`` (the feature's description,
the files it changes as they are after it, and its hidden tests), and ``splits.json``."""


def read_tree(root: str) -> dict[str, str]:
    out = {}
    for dp, _, files in os.walk(root):
        for f in sorted(files):
            path = os.path.join(dp, f)
            with open(path) as fh:
                out[os.path.relpath(path, root)] = fh.read()
    return dict(sorted(out.items()))


def load_repos(src: str = SRC) -> dict[str, dict]:
    repos = {}
    for name in sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d))):
        r = os.path.join(src, name)
        feats = sorted((d for d in os.listdir(r) if d.startswith("feature")), key=lambda d: int(d[7:]))
        repos[name] = {"base": read_tree(os.path.join(r, "base")), "combined": read_tree(os.path.join(r, "combined")),
                       "features": [{"md": open(os.path.join(r, f, "feature.md")).read().rstrip("\n"),
                                     "files": read_tree(os.path.join(r, f, "files")),
                                     "tests": read_tree(os.path.join(r, f, "tests"))} for f in feats]}
    return repos


def git(cwd, *args):
    from scope.envs.coop.evaluate import git as run_git  # the grader's own git call (fixed identity, no config)

    return run_git(cwd, *args).stdout


def write(root: str, files: dict[str, str]) -> None:
    for p, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, p)) or root, exist_ok=True)
        with open(os.path.join(root, p), "w") as f:
            f.write(text)


def diff_of(base: dict[str, str], files: dict[str, str]) -> str:
    with tempfile.TemporaryDirectory() as d:
        write(d, base)
        git(d, "init", "-q")
        git(d, "add", "-A")
        git(d, "commit", "-q", "-m", "base")
        write(d, files)
        git(d, "add", "-A")
        return git(d, "diff", "--cached")


def main() -> None:
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, here)
    ap.add_argument("--out", default=os.path.join(here, "scope", "envs", "coop", "suite"))
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    for name, spec in load_repos().items():
        td = os.path.join(a.out, f"{name}_task", "task1")
        write(os.path.join(td, "repo"), spec["base"])
        with open(os.path.join(td, "combined.patch"), "w") as f:
            f.write(diff_of(spec["base"], spec["combined"]))
        for k, feat in enumerate(spec["features"], 1):
            fd = os.path.join(td, f"feature{k}")
            os.makedirs(fd)
            with open(os.path.join(fd, "feature.md"), "w") as f:
                f.write(feat["md"] + "\n")
            with open(os.path.join(fd, "feature.patch"), "w") as f:
                f.write(diff_of(spec["base"], feat["files"]))
            with open(os.path.join(fd, "tests.patch"), "w") as f:
                f.write(diff_of(spec["base"], feat["tests"]))
    with open(os.path.join(SRC, "splits.json")) as f:
        splits = json.load(f)
    with open(os.path.join(a.out, "splits.json"), "w") as f:
        json.dump(splits, f, indent=1)
    # grade every reference pair through scope's pipeline and record what it gives
    from scope.envs.coop.evaluate import evaluate_pair
    from scope.envs.coop.sandbox import Limits, Sandbox
    from scope.envs.coop.tasks import load_task_dir, task_dirs

    def box(ws):
        return Sandbox(ws, Limits(wall_seconds=120))

    pairs = {}
    for rel in task_dirs(a.out):
        t = load_task_dir(os.path.join(a.out, rel))
        feats = t["features"]
        tests = {f["name"]: f["tests_patch"] for f in feats}
        whole = evaluate_pair(t["repo_dir"], {"agent1": t["combined_patch"], "agent2": ""}, tests, box)
        if not whole.success:
            raise SystemExit(f"{rel}: the combined patch does not pass every feature: "
                             f"{ {k: (v.note, v.output[-500:]) for k, v in whole.features.items()} }")
        for fa, fb in itertools.combinations(feats, 2):
            for f in (fa, fb):  # each reference patch passes its own tests alone
                alone = evaluate_pair(t["repo_dir"], {"agent1": f["reference_patch"], "agent2": ""},
                                      {f["name"]: f["tests_patch"]}, box)
                if not alone.success:
                    raise SystemExit(f"{rel}/{f['name']}: the reference patch fails its own tests")
            r = evaluate_pair(t["repo_dir"], {"agent1": fa["reference_patch"], "agent2": fb["reference_patch"]},
                              {fa["name"]: fa["tests_patch"], fb["name"]: fb["tests_patch"]}, box)
            pid = f"{rel}/{fa['name']}-{fb['name']}"
            pairs[pid] = {"merge": r.merge.status, "reference_success": r.success}
            print(f"{pid}: merge {r.merge.status}, reference pair {'passes' if r.success else 'FAILS'}", flush=True)
    with open(os.path.join(a.out, "pairs.json"), "w") as f:
        json.dump(pairs, f, indent=1, sort_keys=True)
    kinds = {(p["merge"], p["reference_success"]) for p in pairs.values()}
    print(f"{len(pairs)} pairs; (merge, reference pair passes) kinds: {sorted(kinds)}")


if __name__ == "__main__":
    main()
