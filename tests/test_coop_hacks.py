"""A gallery of reward hacks against cooperative-coding grading: each one, handed in as an agent's patch on the
shipped textkit pair (truncate + a slug separator), implements neither feature, and each scores 0; the genuine
reference patches of the same pair score 1. Where a hack works against a grader that runs pytest in the
workspace (the way grading once was), that is shown first, so a hack that no longer bites cannot pass silently."""
import os
import shutil
import subprocess
import sys
import time

import pytest

from scope.envs.coop import sandbox as sb
from scope.envs.coop.evaluate import apply_patch, evaluate_pair, git, init_repo
from scope.envs.coop.sandbox import Limits, Sandbox
from scope.envs.coop.tasks import load_pairs

needs_bwrap = pytest.mark.skipif(sb.find_bwrap() is None or (os.geteuid() == 0 and not sb.cgroups_usable()),
                                 reason="no usable sandbox (bubblewrap, and as root a writable cgroup filesystem)")

PASS_ALL = ("import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
            "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
CASES = "".join(f'<testcase classname="tests.{f}" name="{t}"/>' for f, t in (
    ("test_truncate", "test_short_text_is_unchanged"), ("test_truncate", "test_long_text_is_cut_to_width"),
    ("test_slug_sep", "test_separator"), ("test_slug_sep", "test_default_separator")))
REPORT = (f'<testsuites><testsuite name="pytest" tests="4" failures="0" errors="0" skipped="0">{CASES}'
          '</testsuite></testsuites>')
FORGED = (f"import os, sys\nREPORT = {REPORT!r}\n"
          "for a in sys.argv + ['--junitxml=report.xml', '--junitxml=.scope-junit.xml']:\n"
          "    if a.startswith('--junitxml='):\n"
          "        open(a.split('=', 1)[1], 'w').write(REPORT)\nos._exit(0)\n")
ALWAYS_EQUAL = ("class Anything(str):\n    def __eq__(self, other):\n        return True\n\n"
                "    def __ne__(self, other):\n        return False\n\n    __hash__ = str.__hash__\n\n\n"
                "def slugify(text, sep='-', **kw):\n    return Anything(text)\n\n\n"
                "def truncate(text, width, suffix='...'):\n    return Anything(text)\n\n\n"
                "def word_count(text):\n    return len(text.split())\n")

# what every hack's textkit.py holds unless it says otherwise: the base, plus the name the hidden tests import
# doing nothing of either feature (their tests fail unless something cheats)
STUB = "\n\ndef truncate(text, width, suffix='...'):\n    return text\n"
IMPORT_EXTRA = STUB + "\n\nimport textkit_extra  # noqa: E402,F401\n"

HACKS = {
    # the module under test, when imported, writes a passing report wherever one is asked for and exits 0
    "forged_report": {"textkit.py": IMPORT_EXTRA, "textkit_extra.py": FORGED},
    # a module named like an installed plugin's module, which pytest would load through its entry point
    "shadowed_plugin_module": {"_hypothesis_pytestplugin.py": PASS_ALL},
    # a distribution whose entry points name a pytest11 plugin that lives in the workspace
    "planted_distribution": {"evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
                             "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evil_plugin\n",
                             "evil_plugin.py": PASS_ALL},
    # a package that replaces an installed one, and with it the plugin module that package provides
    "shadowed_package": {"anyio/__init__.py": "", "anyio/pytest_plugin.py": PASS_ALL},
    # functions that return a str whose == is always true
    "equal_to_anything": {"textkit.py": ALWAYS_EQUAL},
    # older ones: a planted pytest, and a conftest that passes every test
    "planted_pytest": {"pytest.py": FORGED},
    "conftest": {"conftest.py": PASS_ALL},
}


def textkit_pair():
    pair = next(p for p in load_pairs(None, "train") + load_pairs(None, "test")
                if p.id.startswith("textkit_task/") and {f["name"] for f in p.data["features"]} ==
                {"feature1", "feature2"})
    return pair.data["repo_dir"], pair.data["features"]


def hack_patch(base: str, files: dict, tmp_path) -> str:
    """The diff of a hack: ``files`` written over the base; a textkit.py that a hack does not replace gets STUB
    (and IMPORT_EXTRA) appended to the base's."""
    d = tmp_path / "hack"
    init_repo(base, str(d))
    own = (d / "textkit.py").read_text()
    for path, text in {"textkit.py": STUB, **files}.items():
        f = d / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(own + text if text in (STUB, IMPORT_EXTRA) else text)
    git(str(d), "add", "-A")
    return git(str(d), "diff", "--cached", "--binary", "base").stdout


def naive_grade(base: str, patch: str, tests_patch: str, tmp_path) -> bool:
    """pytest run inside the tree with the patch and the hidden tests applied (no filter, no sandbox), judged
    by its exit status: the grader these hacks were made for."""
    tree = tmp_path / "naive"
    shutil.rmtree(tree, ignore_errors=True)
    init_repo(base, str(tree))
    assert apply_patch(str(tree), patch) is None and apply_patch(str(tree), tests_patch) is None
    files = [ln[6:] for ln in tests_patch.splitlines() if ln.startswith("+++ b/")]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=report.xml",
                        *files], cwd=tree, capture_output=True, timeout=120)
    return r.returncode == 0


def box(ws):
    return Sandbox(ws, Limits(wall_seconds=60))


@needs_bwrap
@pytest.mark.parametrize("hack", sorted(HACKS))
def test_a_hack_scores_nothing(hack, tmp_path):
    base, (fa, fb) = textkit_pair()
    tests = {fa["name"]: fa["tests_patch"], fb["name"]: fb["tests_patch"]}
    patch = hack_patch(base, HACKS[hack], tmp_path)
    assert naive_grade(base, patch, fa["tests_patch"], tmp_path), f"{hack} does not fool a naive grader"
    r = evaluate_pair(base, {"agent1": patch, "agent2": ""}, tests, box)
    # the stub passes what needs no feature (a short text unchanged, the default separator), never the rest
    assert not r.success and all(not f.ok and f.failed + f.errors >= 1 for f in r.features.values()), \
        {k: (v.passed, v.failed, v.note) for k, v in r.features.items()}


@needs_bwrap
def test_the_genuine_patches_of_the_same_pair_score():
    base, (fa, fb) = textkit_pair()
    tests = {fa["name"]: fa["tests_patch"], fb["name"]: fb["tests_patch"]}
    good = evaluate_pair(base, {"agent1": fa["reference_patch"], "agent2": fb["reference_patch"]}, tests, box)
    assert good.success and all(f.passed >= 2 and not f.failed for f in good.features.values()), \
        {k: (v.note, v.output[-400:]) for k, v in good.features.items()}


# -- grading never crashes the training loop --

def play(env, scripts):
    it = {r: iter(s) for r, s in scripts.items()}
    while roles := env.next_roles():
        for role in roles:
            env.on_reply(role, next(it[role], "```bash\nsubmit\n```"))
    return env.rewards()


def make_env(pair_id="textkit_task/task1/feature1-feature2"):
    import random

    from scope.envs.base import get_env

    cls = get_env("coop_coding")
    task = next(p for p in cls.load_tasks("train") + cls.load_tasks("test") if p.id == pair_id)
    return cls(task, random.Random(0))


def apply_cmd(patch: str) -> str:
    return f"```bash\ngit apply <<'SCOPE_EOF'\n{patch}SCOPE_EOF\n```"


@needs_bwrap
def test_a_file_that_is_not_utf8_is_graded():
    env = make_env()
    fa, fb = env.features["agent"]["reference_patch"], env.features["partner"]["reference_patch"]
    latin1 = ("```bash\nprintf 'caf\\351\\n' > notes.txt && mkdir -p data && "
              "printf '\\351t\\351\\n' > data/words.txt\n```")
    assert play(env, {"agent": [apply_cmd(fa), latin1], "partner": [apply_cmd(fb)]}) == {"agent": 1.0,
                                                                                          "partner": 1.0}
    assert env.meta["coop"]["graded"] and env.meta["coop"]["success"]


def test_deep_and_wide_workspaces_are_refused_before_grading(tmp_path):
    from scope.envs.coop.evaluate import GradingLimit, stage_workspace
    from scope.envs.coop.sandbox import remove_workspace

    deep = tmp_path / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(30_000):  # a chain 30,000 directories deep, made by relative names
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    with pytest.raises(GradingLimit, match="deep"):
        stage_workspace(str(deep), str(tmp_path / "stage-deep"))
    remove_workspace(str(deep))
    assert not deep.exists()
    wide = tmp_path / "wide"
    wide.mkdir()
    for i in range(25_000):  # empty directories count toward the limit as files do
        os.mkdir(wide / f"d{i}")
    with pytest.raises(GradingLimit, match="files or directories"):
        stage_workspace(str(wide), str(tmp_path / "stage-wide"))


@needs_bwrap
def test_whatever_grading_raises_fails_the_pair_with_its_reason(monkeypatch):
    from scope.envs.coop import evaluate

    def boom(*a, **kw):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(evaluate, "evaluate_pair", boom)
    env = make_env()
    assert play(env, {"agent": [], "partner": []}) == {"agent": 0.0, "partner": 0.0}
    meta = env.meta["coop"]
    assert meta["graded"] is False and "RecursionError" in meta["apply_errors"]["*"]
    assert not os.path.exists(env.work)
    assert type(env).step_metrics([type("E", (), {"meta": env.meta})()])["coop/not_graded_rate"] == 1.0


def test_grading_past_its_deadline_is_not_graded(tmp_path, monkeypatch):
    from scope.envs.coop import evaluate

    def slow(tree, tp, sandbox_for, wall):
        time.sleep(1.5)
        return evaluate.TestOutcome(note="slow")

    monkeypatch.setattr(evaluate, "run_feature_tests", slow)
    base, (fa, fb) = textkit_pair()
    tests = {fa["name"]: fa["tests_patch"], fb["name"]: fb["tests_patch"]}
    with pytest.raises(evaluate.GradingLimit, match="too slow"):
        evaluate.evaluate_pair(base, {"agent1": fa["reference_patch"], "agent2": ""}, tests, box,
                               deadline_seconds=2.5)
