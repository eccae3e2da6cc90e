"""Grading a pair of patches as CooperBench does, on a small repository made here: filter, branch,
merge (plain, then union), hidden tests run in the sandbox and read from pytest's report."""
import os
import shutil
import subprocess

import pytest

from scope.envs.coop import sandbox as sb
from scope.envs.coop.evaluate import evaluate_pair, filter_patch, git, merge_patches, split_patch
from scope.envs.coop.sandbox import Limits, Sandbox

BASE = {"calc.py": "def add(a, b):\n    return a + b\n",
        "README.md": "calc\n"}


def make_base(tmp_path):
    d = tmp_path / "base"
    d.mkdir()
    for k, v in BASE.items():
        (d / k).write_text(v)
    return str(d)


def diff(base, changes: dict[str, str | None], tmp_path, name) -> str:
    """The git diff that turns ``base`` into ``base`` + ``changes`` (path -> new text, None: deleted)."""
    d = tmp_path / f"edit-{name}"
    shutil.copytree(base, d)
    git(str(d), "init", "-q")
    git(str(d), "add", "-A")
    git(str(d), "commit", "-q", "-m", "base")
    for p, text in changes.items():
        f = d / p
        if text is None:
            f.unlink()
        else:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
    git(str(d), "add", "-A")
    return git(str(d), "diff", "--cached").stdout


SUB = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
MUL = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
TEST_SUB = "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n"
TEST_MUL = "from calc import mul\n\n\ndef test_mul():\n    assert mul(4, 3) == 12\n"


def sandbox_for(ws):
    return Sandbox(ws, Limits(wall_seconds=60))


needs_bwrap = pytest.mark.skipif(sb.find_bwrap() is None or (os.geteuid() == 0 and not sb.cgroups_usable()),
                                 reason="no usable sandbox (bubblewrap, and as root a writable cgroup filesystem)")


def test_filter_drops_tests_and_test_configuration_keeps_new_files(tmp_path):
    base = make_base(tmp_path)
    p = diff(base, {"calc.py": SUB, "tests/test_sub.py": TEST_SUB, "helpers/new_module.py": "X = 1\n",
                    "conftest.py": "collect_ignore = ['tests']\n", "calc_test.py": "", "setup.cfg":
                    "[tool:pytest]\naddopts = -k nothing\n", "pyproject.toml": "[project]\nname = 'calc'\n"},
             tmp_path, "f")
    f = filter_patch(p)
    kept = [d.path for d in split_patch(f.patch)]
    assert sorted(kept) == ["calc.py", "helpers/new_module.py", "pyproject.toml"]
    assert sorted(f.dropped) == ["calc_test.py", "conftest.py", "setup.cfg", "tests/test_sub.py"]


def test_disjoint_edits_merge_cleanly_and_overlapping_ones_by_union(tmp_path):
    base = make_base(tmp_path)
    a = diff(base, {"calc.py": SUB}, tmp_path, "a")
    readme = diff(base, {"README.md": "calc, a calculator\n"}, tmp_path, "r")
    b = diff(base, {"calc.py": MUL}, tmp_path, "b")
    m = merge_patches(base, {"agent1": a, "agent2": readme}, str(tmp_path / "w1"))
    assert m.status == "clean" and not m.conflicts
    m = merge_patches(base, {"agent1": a, "agent2": b}, str(tmp_path / "w2"))
    assert m.status == "union" and m.conflicts == ["calc.py"]
    merged = open(os.path.join(m.tree, "calc.py")).read()
    assert "def sub" in merged and "def mul" in merged and ".gitattributes" not in os.listdir(m.tree)


def test_a_patch_that_does_not_apply_is_recorded(tmp_path):
    base = make_base(tmp_path)
    bad = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n-def nothing():\n+def x():\n"
    m = merge_patches(base, {"agent1": bad, "agent2": ""}, str(tmp_path / "w"))
    assert "agent1" in m.apply_errors and m.status == "clean"


@needs_bwrap
def test_a_pair_succeeds_only_if_both_features_pass(tmp_path):
    base = make_base(tmp_path)
    a = diff(base, {"calc.py": SUB}, tmp_path, "a")
    b = diff(base, {"calc.py": MUL}, tmp_path, "b")
    tests = {"sub": diff(base, {"tests/test_sub.py": TEST_SUB}, tmp_path, "ts"),
             "mul": diff(base, {"tests/test_mul.py": TEST_MUL}, tmp_path, "tm")}
    r = evaluate_pair(base, {"agent1": a, "agent2": b}, tests, sandbox_for)
    assert r.merge.status == "union" and r.success, {k: (v.note, v.output) for k, v in r.features.items()}
    assert all(f.passed == 1 and f.failed == 0 for f in r.features.values())
    r = evaluate_pair(base, {"agent1": a, "agent2": ""}, tests, sandbox_for)  # one feature missing
    assert not r.success and r.features["sub"].ok and not r.features["mul"].ok
    # an agent that ships its own test file for the other feature does not make it pass: tests are filtered
    cheat = diff(base, {"calc.py": SUB, "tests/test_mul.py": "def test_mul():\n    pass\n"}, tmp_path, "c")
    r = evaluate_pair(base, {"agent1": cheat, "agent2": ""}, tests, sandbox_for)
    assert not r.features["mul"].ok and r.merge.dropped["agent1"] == ["tests/test_mul.py"]


@needs_bwrap
def test_a_union_merge_can_yield_broken_code(tmp_path):
    """Both agents change the same line of add(): the union keeps both returns, and the second one is dead,
    so one feature's tests fail although each patch alone passes its own."""
    base = make_base(tmp_path)
    a = diff(base, {"calc.py": "def add(a, b):\n    return round(a + b, 2)\n"}, tmp_path, "a")
    b = diff(base, {"calc.py": "def add(a, b):\n    return int(a) + int(b)\n"}, tmp_path, "b")
    tests = {"round": diff(base, {"tests/test_round.py":
                                  "from calc import add\n\n\ndef test_round():\n    assert add(0.1, 0.2) == 0.3\n"},
                           tmp_path, "t1"),
             "ints": diff(base, {"tests/test_ints.py":
                                 "from calc import add\n\n\ndef test_ints():\n    assert add('2', '3') == 5\n"},
                          tmp_path, "t2")}
    alone = evaluate_pair(base, {"agent1": b, "agent2": ""}, {"ints": tests["ints"]}, sandbox_for)
    assert alone.success
    r = evaluate_pair(base, {"agent1": a, "agent2": b}, tests, sandbox_for)
    assert r.merge.status == "union" and not r.success
    assert sum(f.ok for f in r.features.values()) == 1


@needs_bwrap
def test_printed_text_cannot_fake_a_pass(tmp_path):
    """A patch that prints pytest's summary line and exits 0 at import: the report decides, not the text."""
    base = make_base(tmp_path)
    fake = diff(base, {"calc.py": "import os\nprint('1 passed in 0.01s')\nos._exit(0)\n"}, tmp_path, "f")
    tests = {"sub": diff(base, {"tests/test_sub.py": TEST_SUB}, tmp_path, "ts")}
    r = evaluate_pair(base, {"agent1": fake, "agent2": ""}, tests, sandbox_for)
    assert not r.success and r.features["sub"].passed == 0, r.features["sub"]


def test_git_is_there():
    assert subprocess.run(["git", "--version"], capture_output=True).returncode == 0


# ---- what an agent leaves behind, taken into its patch on the host ------------------------------------------
def _workspace(tmp_path):
    from scope.envs.coop.evaluate import init_repo

    ws = tmp_path / "ws"
    init_repo(make_base(tmp_path), str(ws))
    gitdir = tmp_path / "gitdir"
    shutil.copytree(ws / ".git", gitdir)  # as the environment keeps it, before the agent runs anything
    return ws, str(gitdir)


def test_a_fifo_or_a_nested_git_does_not_hang_or_leak_into_the_patch(tmp_path):
    """`mkdir -p sub3/.git/objects sub3/.git/refs && mkfifo sub3/.git/HEAD` once made host git block for good;
    a FIFO beside the files made `git add -A` wait; a `.git` file pointing at another repository made git read
    it. Now git sees a staged copy of regular files and links only, with no .git entry anywhere."""
    import time

    from scope.envs.coop.evaluate import take_patch

    ws, gitdir = _workspace(tmp_path)
    (ws / "calc.py").write_text(SUB)
    (ws / "sub3" / ".git" / "objects").mkdir(parents=True)
    (ws / "sub3" / ".git" / "refs").mkdir()
    os.mkfifo(ws / "sub3" / ".git" / "HEAD")
    os.mkfifo(ws / "pipe")
    (ws / "sub3" / "code.py").write_text("x = 1\n")
    (ws / "other").mkdir()
    (ws / "other" / ".git").write_text(f"gitdir: {tmp_path / 'gitdir'}\n")  # a pointer at a host repository
    (ws / "other" / "y.py").write_text("y = 2\n")
    t0 = time.monotonic()
    patch = take_patch(str(ws), gitdir)
    assert time.monotonic() - t0 < 30
    paths = {d.path for d in split_patch(patch)}
    assert paths == {"calc.py", "sub3/code.py", "other/y.py"}, paths


def test_a_workspace_past_the_grading_bounds_fails_with_a_note(tmp_path):
    from scope.envs.coop.evaluate import GradingLimit, stage_workspace

    ws, _ = _workspace(tmp_path)
    for i in range(30):
        (ws / f"f{i}.txt").write_text("x")
    with pytest.raises(GradingLimit, match="more than 20 files"):
        stage_workspace(str(ws), str(tmp_path / "stage1"), max_files=20)
    (ws / "big.bin").write_bytes(b"\0" * (2 << 20))
    with pytest.raises(GradingLimit, match="1 MB"):
        stage_workspace(str(ws), str(tmp_path / "stage2"), max_bytes=1 << 20)


def test_modules_that_would_shadow_the_test_run_are_filtered(tmp_path):
    from scope.envs.coop.evaluate import shadows

    for p in ("pytest.py", "_pytest/config.py", "pluggy/__init__.py", "json.py", "xml/etree.py",
              "sitecustomize.py", "evil.pth", "unittest/__init__.py"):
        assert shadows(p), p
    for p in ("calc.py", "src/json.py", "mypkg/pytest.py", "README.md", "docs/xml/a.txt"):
        assert not shadows(p), p
    base = make_base(tmp_path)
    planted = diff(base, {"calc.py": SUB, "pytest.py": "raise SystemExit(0)\n"}, tmp_path, "p")
    f = filter_patch(planted)
    assert f.dropped == ["pytest.py"] and "calc.py" in f.patch


@needs_bwrap
def test_a_planted_pytest_cannot_win_the_pair(tmp_path):
    """A workspace `pytest.py` that writes a passing JUnit report and exits 0 once scored 1.0 with no feature
    written: it is filtered from the patch, and the grader's pytest is imported before the workspace joins
    sys.path, so even a tree that holds one runs the real pytest."""
    from scope.envs.coop.evaluate import run_feature_tests

    fake = ("import sys\nopen('.scope-junit.xml', 'w').write('<testsuites><testsuite tests=\"1\" failures=\"0\" "
            "errors=\"0\" skipped=\"0\"><testcase name=\"t\"/></testsuite></testsuites>')\nsys.exit(0)\n")
    base = make_base(tmp_path)
    tests = {"sub": diff(base, {"tests/test_sub.py": TEST_SUB}, tmp_path, "ts")}
    r = evaluate_pair(base, {"agent1": diff(base, {"pytest.py": fake}, tmp_path, "f"), "agent2": ""}, tests,
                      sandbox_for)
    assert not r.success and r.merge.dropped["agent1"] == ["pytest.py"]
    from scope.envs.coop.evaluate import init_repo

    tree = tmp_path / "tree"
    init_repo(base, str(tree))
    (tree / "pytest.py").write_text(fake)  # as if it had got through: the real pytest still runs
    out = run_feature_tests(str(tree), tests["sub"], sandbox_for)
    assert not out.ok and out.failed + out.errors >= 1, (out.note, out.output[-500:])
