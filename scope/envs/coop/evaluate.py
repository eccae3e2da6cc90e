"""Grading a pair of patches the way CooperBench does: filter, branch, merge, run each feature's hidden tests.

1. **Filter.** File diffs that touch tests are dropped from an agent's patch (a path containing
   ``/test_``, ``/tests/``, ``_test.py``, ``/test/`` or ``tests.py``, as CooperBench's evaluator
   drops them), and so are diffs of test configuration (``conftest.py``, ``pytest.ini``, ``tox.ini``,
   and ``setup.cfg`` / ``pyproject.toml`` diffs whose changed lines mention pytest or tox): an agent
   cannot turn the hidden tests off. So are top-level modules that a test run would import in place of
   pytest's own or the standard library's (``pytest.py``, ``_pytest/``, ``json.py``: :data:`SHADOWING`). New
   files are kept.
2. **Branch.** Each filtered patch is applied (``git apply``, then ``git apply --3way``) on a branch of
   its own from the base commit and committed there.
3. **Merge.** ``git merge`` of the first agent's branch into the second's (``--no-ff``); on a conflict
   the merge is redone with ``* merge=union`` in ``.gitattributes`` (both sides' lines kept), and the
   merge status says which (``clean``, ``union``, or ``failed`` when even that does not apply).
4. **Test.** For each feature: a copy of the merged tree with its ``tests.patch`` applied. The process that
   decides never runs the candidate's code: pytest runs on the host on copies of the hidden test files alone
   (``judge.py``: no workspace on the path, no plugin autoloading, a report the candidate cannot reach), and
   every module of the tree the tests import is a stand-in that asks a process in the sandbox
   (``judge_child.py``) for its attributes, calls and items over two pipes. Values come back as plain data
   and are compared on the host, so a forged report, a planted plugin or distribution, a shadowed package, an
   early exit or an object equal to anything cannot pass a test. A feature passes iff pytest exits 0, at
   least one test passed and every test function the hidden files define was reported passed (one that was
   expected and not reported fails). The pair succeeds iff both features pass.
"""
from __future__ import annotations

import base64
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from .sandbox import Sandbox, make_workspace, remove_workspace, work_dir  # noqa: F401 - Sandbox: the type sandbox_for returns

_TEST_PATH = ("/test_", "/tests/", "_test.py", "/test/", "tests.py")
_TEST_CONFIG = ("conftest.py", "pytest.ini", "tox.ini")
_CONFIG_MAYBE = ("setup.cfg", "pyproject.toml")
_CONFIG_WORDS = re.compile(r"pytest|tox|addopts|testpaths|python_files|norecursedirs")


@dataclass
class FileDiff:
    path: str
    text: str


def split_patch(patch: str) -> list[FileDiff]:
    """A unified git diff as one chunk per file (``diff --git a/X b/Y`` ... up to the next)."""
    out: list[FileDiff] = []
    cur: list[str] = []
    path = None
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git "):
            if cur:
                out.append(FileDiff(path or "", "".join(cur)))
            cur, path = [line], _path_of(line)
        elif cur:
            cur.append(line)
    if cur:
        out.append(FileDiff(path or "", "".join(cur)))
    return out


def _path_of(header: str) -> str:
    m = re.match(r"diff --git a/(.*?) b/(.*)$", header.rstrip("\n"))
    return m.group(2) if m else header.split()[-1]


def is_test_path(path: str) -> bool:
    p = "/" + path
    return any(s in p for s in _TEST_PATH)


def touches_test_config(d: FileDiff) -> bool:
    name = os.path.basename(d.path)
    if name in _TEST_CONFIG:
        return True
    if name in _CONFIG_MAYBE:
        changed = [ln[1:] for ln in d.text.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
        return any(_CONFIG_WORDS.search(ln) for ln in changed)
    return False


@dataclass
class Filtered:
    patch: str
    dropped: list[str] = field(default_factory=list)


# Top-level modules a test run imports from the workspace's root before (or instead of) the real ones: the test
# runner and its dependencies, the interpreter's start-up hooks and the whole standard library (the workspace
# root is first on sys.path while the tests run). An agent's file of such a name is dropped from its patch.
SHADOWING = frozenset(sys.stdlib_module_names) | {"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging",
                                                  "sitecustomize", "usercustomize"}


def shadows(path: str) -> bool:
    """``path`` is (or lies in) a top-level module or package that a test run would import in place of the
    runner's own or the standard library's (``pytest.py``, ``_pytest/``, ``json.py``, ``xml/``...)."""
    top = path.split("/", 1)[0]
    name = top if "/" in path else top.split(".", 1)[0] if top.endswith((".py", ".pyc", ".so", ".pyd", ".pth")) \
        else top
    return name in SHADOWING or top.endswith(".pth")


def filter_patch(patch: str) -> Filtered:
    """The agent's patch without test files, test configuration, and modules that would shadow the test
    runner's or the standard library's (see the module docstring)."""
    kept, dropped = [], []
    for d in split_patch(patch):
        if is_test_path(d.path) or touches_test_config(d) or shadows(d.path):
            dropped.append(d.path)
        else:
            kept.append(d.text)
    text = "".join(kept)
    if text and not text.endswith("\n"):
        text += "\n"
    return Filtered(text, dropped)


# Every git call on the host holds these: no configuration but the repository's own (never a global or
# system file, never a .gitconfig in an agent-written HOME), and nothing that runs a command.
_SAFE = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "core.attributesFile=/dev/null",
         "-c", "safe.directory=*", "-c", "protocol.allow=never")


GIT_SECONDS = 60.0
"""The longest any host-side git step may take; past it the grading fails with that note (counted)."""


def git(cwd: str, *args: str, check: bool = True, input: str | None = None,
        timeout: float = GIT_SECONDS) -> subprocess.CompletedProcess:
    """Run git on the host, on a repository scope made (never one an agent wrote: see :func:`take_patch`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="scope", GIT_AUTHOR_EMAIL="scope@localhost", GIT_COMMITTER_NAME="scope",
               GIT_COMMITTER_EMAIL="scope@localhost", GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
               GIT_ATTR_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0", HOME="/nonexistent", XDG_CONFIG_HOME="/nonexistent",
               LC_ALL="C")
    try:
        # bytes that are not UTF-8 (a Latin-1 file in a diff) pass through as surrogates and back, unchanged
        r = subprocess.run(["git", *_SAFE, *args], cwd=cwd, capture_output=True, text=True, env=env, input=input,
                           timeout=timeout, encoding="utf-8", errors="surrogateescape")
    except subprocess.TimeoutExpired:
        raise GradingLimit(f"git {args[-1] if args else ''}: over {timeout:.0f} s on the host") from None
    if check and r.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def init_repo(base_dir: str, dest: str) -> None:
    """``dest`` (missing or empty): a git repository whose one commit is the files of ``base_dir`` (its own
    .git ignored)."""
    shutil.copytree(base_dir, dest, ignore=shutil.ignore_patterns(".git"), symlinks=True, dirs_exist_ok=True)
    git(dest, "init", "-q", "-b", "base")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--allow-empty", "-m", "base")


class GradingLimit(RuntimeError):
    """What an agent left cannot be graded within the host's bounds (files, bytes, seconds): the episode
    fails with this note, is counted, and the step goes on."""


MAX_PATCH_FILES = 20_000
"""Entries (files, links and directories) of a workspace taken into its patch, at most."""
MAX_PATCH_BYTES = 64 << 20
"""Bytes of a workspace's files taken into its patch, at most."""
MAX_PATCH_DEPTH = 64
"""Directories nested deeper than this in a workspace: not graded."""


def stage_workspace(workspace: str, dest: str, max_files: int = MAX_PATCH_FILES, max_bytes: int = MAX_PATCH_BYTES,
                    seconds: float = GIT_SECONDS, max_depth: int = MAX_PATCH_DEPTH) -> None:
    """Copy what git may see of ``workspace`` into ``dest``: regular files and symbolic links only (a FIFO, a
    socket or a device would block or mislead host-side git), never an entry named ``.git`` at any depth (a
    nested repository or a ``gitdir:`` pointer would make git read outside the workspace). The walk holds its
    own stack (any depth is safe to look at); past ``max_files`` entries (directories count), ``max_bytes``,
    ``max_depth`` nested directories or ``seconds``, or a directory that cannot be read: :class:`GradingLimit`."""
    import time

    t0, entries, size = time.monotonic(), 0, 0
    stack = [(workspace, dest, 0)]
    while stack:
        src_dir, out, depth = stack.pop()
        if depth > max_depth:
            raise GradingLimit(f"the workspace nests directories over {max_depth} deep: not graded")
        try:
            os.makedirs(out, exist_ok=True)
            with os.scandir(src_dir) as it:
                found = sorted((e for e in it if e.name != ".git"), key=lambda e: e.name)
        except OSError as e:
            raise GradingLimit(f"the workspace cannot be read whole ({e.strerror}: {e.filename})") from None
        for ent in found:
            if time.monotonic() - t0 > seconds:
                raise GradingLimit(f"taking the patch took over {seconds:.0f} s")
            st = ent.stat(follow_symlinks=False)
            entries += 1
            if stat.S_ISREG(st.st_mode):
                size += st.st_size
            if entries > max_files or size > max_bytes:
                raise GradingLimit(f"the workspace holds more than {max_files} files or directories, or "
                                   f"{max_bytes >> 20} MB: not graded")
            target = os.path.join(out, ent.name)
            if stat.S_ISDIR(st.st_mode):
                stack.append((ent.path, target, depth + 1))
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(ent.path), target)
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(ent.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as f, open(target, "wb") as g:
                    shutil.copyfileobj(f, g)
                os.chmod(target, st.st_mode & 0o755)
            # anything else (a FIFO, a socket, a device) is not a file of a patch: left out


def take_patch(workspace: str, git_dir: str) -> str:
    """The diff of ``workspace``'s files against the base commit, taken with ``git_dir``: a copy of the
    workspace's .git made before the agent ran anything. Git reads a staged copy (:func:`stage_workspace`:
    regular files and links only, no ``.git`` entry anywhere, bounded in files, bytes and time), never the
    workspace itself; the workspace's own .git (config, hooks, attributes drivers, fsmonitor: all the
    agent's to write) is never read; the files' attributes can name drivers, but no driver is configured,
    and diff runs without external diff or textconv."""
    stage = tempfile.mkdtemp(prefix="scope-patch-")
    try:
        stage_workspace(workspace, stage)
        wt = ("--git-dir", git_dir, "--work-tree", stage)
        git(stage, *wt, "add", "-A", "--ignore-errors", check=False)  # a file it cannot add is left out
        return git(stage, *wt, "diff", "--cached", "--binary", "--no-ext-diff", "--no-textconv", "base").stdout
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def apply_patch(repo: str, patch: str) -> str | None:
    """Apply ``patch`` to the work tree and index; None on success, else why it did not apply."""
    if not patch.strip():
        return None
    r = git(repo, "apply", "--index", "--whitespace=nowarn", "-", check=False, input=patch)
    if r.returncode == 0:
        return None
    r2 = git(repo, "apply", "--index", "--3way", "--whitespace=nowarn", "-", check=False, input=patch)
    if r2.returncode == 0:
        return None
    git(repo, "reset", "-q", "--hard", check=False)
    return (r.stderr.strip() or r2.stderr.strip() or "does not apply").splitlines()[0]


@dataclass
class MergeResult:
    status: str                       # clean | union | failed | not graded
    tree: str | None                  # the merged work tree (a git repository), None if failed
    apply_errors: dict[str, str] = field(default_factory=dict)   # branch -> why its patch did not apply
    dropped: dict[str, list[str]] = field(default_factory=dict)  # branch -> files filtered out
    conflicts: list[str] = field(default_factory=list)           # files a plain merge conflicted on


def merge_patches(base_dir: str, patches: dict[str, str], work: str) -> MergeResult:
    """Filter each agent's patch, apply it on its own branch of the base, merge the branches (2 agents)."""
    repo = os.path.join(work, "repo")
    init_repo(base_dir, repo)
    names = list(patches)
    res = MergeResult("clean", repo)
    for name in names:
        f = filter_patch(patches[name])
        res.dropped[name] = f.dropped
        git(repo, "checkout", "-q", "-b", name, "base")
        err = apply_patch(repo, f.patch)
        if err is not None:
            res.apply_errors[name] = err
        git(repo, "commit", "-q", "--allow-empty", "-m", name)
    if len(names) == 1:
        return res
    first, second = names[0], names[1]
    git(repo, "checkout", "-q", second)
    r = git(repo, "merge", "-q", "--no-ff", "--no-edit", first, check=False)
    if r.returncode == 0:
        return res
    res.conflicts = git(repo, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
    git(repo, "merge", "--abort", check=False)
    with open(os.path.join(repo, ".git", "info", "attributes"), "a") as fh:  # union merge, not a tracked file
        fh.write("* merge=union\n")
    r = git(repo, "merge", "-q", "--no-ff", "--no-edit", first, check=False)
    if r.returncode == 0:
        res.status = "union"
        return res
    git(repo, "merge", "--abort", check=False)
    res.status, res.tree = "failed", None
    return res


@dataclass
class TestOutcome:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    exit_code: int = -1
    ok: bool = False
    note: str = ""
    output: str = ""

    @property
    def fraction(self) -> float:
        n = self.passed + self.failed + self.errors
        return self.passed / n if n else 0.0


def junit_counts(source) -> tuple[int, int, int, int]:
    """(passed, failed, errors, skipped) from pytest's JUnit XML report (a path or a binary file)."""
    root = ET.parse(source).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    tests = failures = errors = skipped = 0
    for s in suites:
        tests += int(s.get("tests", 0))
        failures += int(s.get("failures", 0))
        errors += int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
    return tests - failures - errors - skipped, failures, errors, skipped


def run_feature_tests(tree: str, tests_patch: str, sandbox_for, wall_seconds: float | None = None) -> TestOutcome:
    """Copy ``tree``, apply ``tests_patch``, run pytest on its test files in a sandbox; see the docstring."""
    d = work_dir("test")
    ws = make_workspace(os.path.join(d, "ws"))
    try:
        return _run_feature_tests(tree, ws, tests_patch, sandbox_for, wall_seconds)
    finally:
        remove_workspace(ws)
        shutil.rmtree(d, ignore_errors=True)


def _run_feature_tests(tree: str, ws: str, tests_patch: str, sandbox_for, wall_seconds: float | None) -> TestOutcome:
    shutil.copytree(tree, ws, symlinks=True, dirs_exist_ok=True)
    err = apply_patch(ws, tests_patch)
    if err is not None:
        return TestOutcome(note=f"the hidden tests do not apply: {err}")
    files = sorted({x.path for x in split_patch(tests_patch) if x.path.endswith(".py")
                    and os.path.exists(os.path.join(ws, x.path))})
    if not files:
        return TestOutcome(note="the hidden tests patch names no test file")
    return judge(ws, files, sandbox_for(ws), wall_seconds)


_HERE = os.path.dirname(os.path.abspath(__file__))


def top_modules(tree: str) -> set[str]:
    """The names a test could import from ``tree``: its top-level modules and packages (not its tests, not a
    name of the standard library or the test runner's)."""
    out = set()
    for name in os.listdir(tree):
        full = os.path.join(tree, name)
        mod = name[:-3] if name.endswith(".py") and os.path.isfile(full) else name if os.path.isdir(full) else ""
        if mod.isidentifier() and mod not in ("tests", "test") and not shadows(mod):
            out.add(mod)
    return out


def expected_tests(judge_dir: str, files: list[str]) -> set[str]:
    """The test functions the hidden test files define (``file::name`` and ``file::Class::name``)."""
    import ast

    out = set()
    for f in files:
        tree = ast.parse(open(os.path.join(judge_dir, f), "rb").read())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                out.add(f"{f}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                out |= {f"{f}::{node.name}::{m.name}" for m in node.body
                        if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")}
    return out


def reported_tests(root: ET.Element) -> dict[str, bool]:
    """Test id (``file::[Class::]name``, parameters dropped) -> whether every one of its cases passed."""
    out: dict[str, bool] = {}
    for case in root.iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "").split("[", 1)[0]
        parts = cls.split(".")
        # classname is the file's dotted path, then the class where there is one
        klass = [parts.pop()] if parts and parts[-1][:1].isupper() and parts[-1].startswith("Test") else []
        key = "::".join(["/".join(parts) + ".py", *klass, name])
        ok = not any(case.find(t) is not None for t in ("failure", "error", "skipped"))
        out[key] = out.get(key, True) and ok
    return out


def judge(ws: str, files: list[str], box: Sandbox, wall_seconds: float | None) -> TestOutcome:
    """Run the hidden ``files`` (paths in ``ws``) with the judge on the host and the candidate's code in ``box``
    (see judge.py): a feature passes iff pytest exits 0, at least one test passed, and every test the files
    define was reported passed."""
    wall = box.limits.wall_seconds if wall_seconds is None else wall_seconds
    jd = tempfile.mkdtemp(prefix="scope-judge-")
    try:
        for f in files:  # the hidden tests, read without following a link the tree might hold
            os.makedirs(os.path.join(jd, os.path.dirname(f)), exist_ok=True)
            fd = os.open(os.path.join(ws, f), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as src, open(os.path.join(jd, f), "wb") as dst:
                shutil.copyfileobj(src, dst)
        with open(os.path.join(jd, "pytest.ini"), "w") as fh:
            fh.write("[pytest]\n")
        expected = expected_tests(jd, files)
        report = os.path.join(jd, "report.xml")
        child_src = base64.b64encode(open(os.path.join(_HERE, "judge_child.py"), "rb").read()).decode()
        cmd = f"exec python -I -c \"import base64; exec(base64.b64decode('{child_src}'))\""
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            with box.started(cmd, stdin=to_child_r, stdout=from_child_w):
                os.close(to_child_r)
                os.close(from_child_w)
                to_child_r = from_child_w = -1
                env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                       "HOME": jd}
                argv = [sys.executable, "-I", os.path.join(_HERE, "judge.py"), "--to-child", str(to_child_w),
                        "--from-child", str(from_child_r), "--modules", ",".join(sorted(top_modules(ws))),
                        "--seconds", str(wall), "--report", report, *files]
                try:
                    r = subprocess.run(argv, cwd=jd, env=env, pass_fds=(to_child_w, from_child_r),
                                       capture_output=True, timeout=wall + 30)
                    code, text, timed_out = r.returncode, (r.stdout + r.stderr).decode("utf-8", "replace"), False
                except subprocess.TimeoutExpired:
                    code, text, timed_out = -1, "", True
        finally:
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                if fd >= 0:
                    os.close(fd)
        out = TestOutcome(exit_code=code, output=text[-4000:])
        if timed_out or not os.path.exists(report):
            out.note = "the judge wrote no report" + (" (timed out)" if timed_out else "")
            out.failed = len(expected)
            return out
        try:
            root = ET.parse(report).getroot()
            out.passed, out.failed, out.errors, out.skipped = junit_counts(report)
        except ET.ParseError as e:
            out.note = f"unreadable report: {e}"
            return out
        got = reported_tests(root)
        missing = sorted(expected - set(got))
        if missing:
            out.failed += len(missing)
            out.note = f"expected and not reported: {', '.join(missing)}"
        out.ok = code == 0 and out.passed >= 1 and not missing and all(got.get(t, False) for t in expected)
        return out
    finally:
        shutil.rmtree(jd, ignore_errors=True)


@dataclass
class PairResult:
    merge: MergeResult
    features: dict[str, TestOutcome]

    @property
    def success(self) -> bool:
        return self.merge.tree is not None and bool(self.features) and all(f.ok for f in self.features.values())


def not_graded(tests: dict[str, str], reason: str) -> PairResult:
    """The result of a pair that could not be graded (``reason``): it fails, and nothing of it is credited."""
    return PairResult(MergeResult("not graded", None, apply_errors={"*": reason}),
                      {name: TestOutcome(note=f"not graded: {reason}") for name in tests})


GRADE_SECONDS = 600.0
"""The longest grading of one pair may take (merge and every feature's tests); past it: "not graded: too slow"."""


def evaluate_pair(base_dir: str, patches: dict[str, str], tests: dict[str, str], sandbox_for,
                  wall_seconds: float | None = None, deadline_seconds: float = GRADE_SECONDS) -> PairResult:
    """Merge ``patches`` (agent -> diff) and run every feature's hidden ``tests`` (feature -> diff) on the
    merged tree. ``sandbox_for(workspace)`` returns the Sandbox a test run uses. Each feature's run gets
    ``wall_seconds`` at most and what is left of ``deadline_seconds``; none left: :class:`GradingLimit`."""
    import time

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="scope-coop-merge-") as work:
        m = merge_patches(base_dir, patches, work)
        feats: dict[str, TestOutcome] = {}
        for name, tp in tests.items():
            left = deadline_seconds - (time.monotonic() - t0)
            if left <= 1.0:
                raise GradingLimit(f"too slow: grading the pair took over {deadline_seconds:.0f} s")
            wall = left if wall_seconds is None else min(wall_seconds, left)
            feats[name] = (run_feature_tests(m.tree, tp, sandbox_for, wall) if m.tree is not None
                           else TestOutcome(note="the patches could not be merged"))
        m.tree = m.tree and "merged"  # the directory is gone with ``work``
        return PairResult(m, feats)
