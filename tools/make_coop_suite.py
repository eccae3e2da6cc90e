"""Write scope's cooperative-coding suite (scope/envs/coop/suite/) in CooperBench's layout.

Four small Python repositories, four features each (every pair of features of a repository is a task:
24 pairs). Each feature has a description, a reference patch and hidden tests; each repository has a
combined patch with all four features written together. Feature pairs range from disjoint edits (a
clean merge) and appends at the same place (a conflict that a union merge resolves) to two features that
rewrite the same lines (a conflict whose union merge is broken code, so that only coordination passes).
What each reference pair's merge gives is not written by hand: this script grades every pair through
scope's own pipeline and records the outcome in ``pairs.json`` (the suite's tests check it again).

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

REPOS: dict[str, dict] = {}

# ---------------------------------------------------------------------------------------------- textkit
REPOS["textkit"] = {
    "base": {"textkit.py": '''import re


def slugify(text):
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words)


def word_count(text):
    return len(text.split())
'''},
    "features": [
        {"md": "Add `truncate(text, width, suffix=\"...\")` to `textkit.py`: return `text` unchanged when it is at "
               "most `width` characters long; otherwise cut it so that the result, with `suffix` appended, is "
               "exactly `width` characters long (`truncate(\"hello world\", 8)` is `\"hello...\"`).",
         "files": {"textkit.py": '''import re


def slugify(text):
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words)


def word_count(text):
    return len(text.split())


def truncate(text, width, suffix="..."):
    if len(text) <= width:
        return text
    return text[: max(width - len(suffix), 0)] + suffix
'''},
         "tests": {"tests/test_truncate.py": '''from textkit import truncate


def test_short_text_is_unchanged():
    assert truncate("hi", 5) == "hi"


def test_long_text_is_cut_to_width():
    assert truncate("hello world", 8) == "hello..."
    assert truncate("hello world", 6, suffix="~") == "hello~"
'''}},
        {"md": "`slugify` in `textkit.py` takes a separator: `slugify(text, sep=\"-\")` joins the words with `sep` "
               "(`slugify(\"Hello World\", sep=\"_\")` is `\"hello_world\"`); the default stays `-`.",
         "files": {"textkit.py": '''import re


def slugify(text, sep="-"):
    words = re.findall(r"[a-z0-9]+", text.lower())
    return sep.join(words)


def word_count(text):
    return len(text.split())
'''},
         "tests": {"tests/test_slug_sep.py": '''from textkit import slugify


def test_separator():
    assert slugify("Hello World", sep="_") == "hello_world"


def test_default_separator():
    assert slugify("Hello, World!") == "hello-world"
'''}},
        {"md": "`slugify` in `textkit.py` takes a length limit: `slugify(text, max_length=None)`; with a limit the "
               "slug is cut to at most `max_length` characters and never ends with `-` "
               "(`slugify(\"Hello big world\", max_length=9)` is `\"hello-big\"`).",
         "files": {"textkit.py": '''import re


def slugify(text, max_length=None):
    words = re.findall(r"[a-z0-9]+", text.lower())
    slug = "-".join(words)
    if max_length is not None:
        slug = slug[:max_length].rstrip("-")
    return slug


def word_count(text):
    return len(text.split())
'''},
         "tests": {"tests/test_slug_length.py": '''from textkit import slugify


def test_length_limit():
    assert slugify("Hello big world", max_length=9) == "hello-big"
    assert slugify("Hello big world", max_length=10) == "hello-big"


def test_no_limit():
    assert slugify("Hello big world") == "hello-big-world"
'''}},
        {"md": "`word_count` in `textkit.py` counts only words that contain a letter or a digit: "
               "`word_count(\"a - b\")` is 2.",
         "files": {"textkit.py": '''import re


def slugify(text):
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words)


def word_count(text):
    return len([w for w in text.split() if any(c.isalnum() for c in w)])
'''},
         "tests": {"tests/test_word_count.py": '''from textkit import word_count


def test_punctuation_is_not_a_word():
    assert word_count("a - b") == 2
    assert word_count("... hello ...") == 1
'''}}],
    "combined": {"textkit.py": '''import re


def slugify(text, sep="-", max_length=None):
    words = re.findall(r"[a-z0-9]+", text.lower())
    slug = sep.join(words)
    if max_length is not None:
        slug = slug[:max_length].rstrip(sep)
    return slug


def word_count(text):
    return len([w for w in text.split() if any(c.isalnum() for c in w)])


def truncate(text, width, suffix="..."):
    if len(text) <= width:
        return text
    return text[: max(width - len(suffix), 0)] + suffix
'''}}

# -------------------------------------------------------------------------------------------- inventory
_INV_BASE = '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty=1):
        self.items[name] = self.items.get(name, 0) + qty

    def count(self, name):
        return self.items.get(name, 0)
'''
REPOS["inventory"] = {
    "base": {"inventory.py": _INV_BASE},
    "features": [
        {"md": "Add `Inventory.remove(name, qty=1)` in `inventory.py`: it takes `qty` of `name` out and raises "
               "`KeyError` when there are fewer than `qty`; an item whose count reaches 0 is no longer listed in "
               "`items`.",
         "files": {"inventory.py": _INV_BASE + '''
    def remove(self, name, qty=1):
        if self.items.get(name, 0) < qty:
            raise KeyError(name)
        self.items[name] -= qty
        if self.items[name] == 0:
            del self.items[name]
'''},
         "tests": {"tests/test_remove.py": '''import pytest

from inventory import Inventory


def test_remove():
    inv = Inventory()
    inv.add("apple", 3)
    inv.remove("apple", 2)
    assert inv.count("apple") == 1
    inv.remove("apple")
    assert "apple" not in inv.items


def test_remove_too_many():
    inv = Inventory()
    inv.add("pear")
    with pytest.raises(KeyError):
        inv.remove("pear", 2)
'''}},
        {"md": "`Inventory.add` in `inventory.py` refuses a quantity that is not positive: it raises "
               "`ValueError` and changes nothing.",
         "files": {"inventory.py": _INV_BASE.replace('''    def add(self, name, qty=1):
        self.items[name]''', '''    def add(self, name, qty=1):
        if qty <= 0:
            raise ValueError("qty must be positive")
        self.items[name]''')},
         "tests": {"tests/test_positive.py": '''import pytest

from inventory import Inventory


def test_non_positive_quantity_is_refused():
    inv = Inventory()
    for q in (0, -2):
        with pytest.raises(ValueError):
            inv.add("apple", q)
    assert inv.count("apple") == 0
'''}},
        {"md": "Item names in `inventory.py` are case-insensitive: `add(\"Apple\")` and `count(\"APPLE\")` refer "
               "to the same item, stored under the lower-case name.",
         "files": {"inventory.py": '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty=1):
        name = name.lower()
        self.items[name] = self.items.get(name, 0) + qty

    def count(self, name):
        return self.items.get(name.lower(), 0)
'''},
         "tests": {"tests/test_case.py": '''from inventory import Inventory


def test_names_are_case_insensitive():
    inv = Inventory()
    inv.add("Apple", 2)
    inv.add("APPLE")
    assert inv.count("apple") == 3 and list(inv.items) == ["apple"]
'''}},
        {"md": "Add `Inventory.total()` in `inventory.py`: the sum of all quantities.",
         "files": {"inventory.py": _INV_BASE + '''
    def total(self):
        return sum(self.items.values())
'''},
         "tests": {"tests/test_total.py": '''from inventory import Inventory


def test_total():
    inv = Inventory()
    assert inv.total() == 0
    inv.add("a", 2)
    inv.add("b", 5)
    assert inv.total() == 7
'''}}],
    "combined": {"inventory.py": '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty=1):
        if qty <= 0:
            raise ValueError("qty must be positive")
        name = name.lower()
        self.items[name] = self.items.get(name, 0) + qty

    def count(self, name):
        return self.items.get(name.lower(), 0)

    def remove(self, name, qty=1):
        name = name.lower()
        if self.items.get(name, 0) < qty:
            raise KeyError(name)
        self.items[name] -= qty
        if self.items[name] == 0:
            del self.items[name]

    def total(self):
        return sum(self.items.values())
'''}}

# --------------------------------------------------------------------------------------------- settings
_SET_BASE = '''def parse(text):
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        key, value = line.split("=", 1)
        out[key.strip()] = value.strip()
    return out
'''
REPOS["settings"] = {
    "base": {"settings.py": _SET_BASE},
    "features": [
        {"md": "`parse` in `settings.py` skips comment lines: a line whose first non-blank character is `#`.",
         "files": {"settings.py": _SET_BASE.replace('''        if not line:
            continue''', '''        if not line or line.startswith("#"):
            continue''')},
         "tests": {"tests/test_comments.py": '''from settings import parse


def test_comments_are_skipped():
    assert parse("# a comment\\na = x\\n   # another\\n") == {"a": "x"}
'''}},
        {"md": "`parse` in `settings.py` returns integer values as `int`: a value made of digits only (after "
               "stripping) becomes an `int`, everything else stays a string.",
         "files": {"settings.py": _SET_BASE.replace('''        out[key.strip()] = value.strip()''',
                                                    '''        value = value.strip()
        out[key.strip()] = int(value) if value.isdigit() else value''')},
         "tests": {"tests/test_ints.py": '''from settings import parse


def test_digits_become_ints():
    assert parse("port = 8080\\nhost = example") == {"port": 8080, "host": "example"}
'''}},
        {"md": "Add `dump(settings)` to `settings.py`: the inverse of `parse`, one `key = value` line per key in "
               "sorted key order, each ending with a newline.",
         "files": {"settings.py": _SET_BASE + '''

def dump(settings):
    return "".join(f"{k} = {v}\\n" for k, v in sorted(settings.items()))
'''},
         "tests": {"tests/test_dump.py": '''from settings import dump, parse


def test_dump():
    assert dump({"b": "2", "a": "x"}) == "a = x\\nb = 2\\n"
    assert parse(dump({"k": "v"})) == {"k": "v"}
'''}},
        {"md": "`parse` in `settings.py` raises `ValueError` for a non-blank line without `=`; the message "
               "names the line number, counting from 1 (e.g. `line 2: expected key = value`).",
         "files": {"settings.py": '''def parse(text):
    out = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if "=" not in line:
            raise ValueError(f"line {number}: expected key = value")
        key, value = line.split("=", 1)
        out[key.strip()] = value.strip()
    return out
'''},
         "tests": {"tests/test_errors.py": '''import pytest

from settings import parse


def test_a_line_without_equals_is_an_error():
    with pytest.raises(ValueError, match="line 2"):
        parse("a = 1\\nbroken\\n")
'''}}],
    "combined": {"settings.py": '''def parse(text):
    out = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise ValueError(f"line {number}: expected key = value")
        key, value = line.split("=", 1)
        value = value.strip()
        out[key.strip()] = int(value) if value.isdigit() else value
    return out


def dump(settings):
    return "".join(f"{k} = {v}\\n" for k, v in sorted(settings.items()))
'''}}

# ------------------------------------------------------------------------------------------------ stats
_STATS_BASE = '''def mean(xs):
    return sum(xs) / len(xs)


def median(xs):
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2
'''
REPOS["stats"] = {
    "base": {"stats.py": _STATS_BASE},
    "features": [
        {"md": "`mean` in `stats.py` raises `ValueError(\"mean of no values\")` for an empty sequence.",
         "files": {"stats.py": _STATS_BASE.replace('''def mean(xs):
    return sum(xs) / len(xs)''', '''def mean(xs):
    if not xs:
        raise ValueError("mean of no values")
    return sum(xs) / len(xs)''')},
         "tests": {"tests/test_mean_empty.py": '''import pytest

from stats import mean


def test_empty_mean():
    with pytest.raises(ValueError):
        mean([])
    assert mean([1, 2, 3]) == 2
'''}},
        {"md": "Add `mode(xs)` to `stats.py`: the most frequent value; among equally frequent values, the "
               "smallest.",
         "files": {"stats.py": _STATS_BASE + '''

def mode(xs):
    counts = {}
    for x in xs:
        counts[x] = counts.get(x, 0) + 1
    best = max(counts.values())
    return min(x for x, c in counts.items() if c == best)
'''},
         "tests": {"tests/test_mode.py": '''from stats import mode


def test_mode():
    assert mode([3, 1, 3, 2]) == 3
    assert mode([2, 1, 2, 1]) == 1
'''}},
        {"md": "`mean` in `stats.py` takes optional weights: `mean(xs, weights=None)`; with weights it is "
               "`sum(w * x) / sum(w)`.",
         "files": {"stats.py": _STATS_BASE.replace('''def mean(xs):
    return sum(xs) / len(xs)''', '''def mean(xs, weights=None):
    if weights is None:
        return sum(xs) / len(xs)
    return sum(w * x for w, x in zip(weights, xs)) / sum(weights)''')},
         "tests": {"tests/test_weighted.py": '''from stats import mean


def test_weighted_mean():
    assert mean([1, 3], weights=[3, 1]) == 1.5
    assert mean([1, 3]) == 2
'''}},
        {"md": "Add `variance(xs)` to `stats.py`: the population variance (mean squared deviation from the "
               "mean).",
         "files": {"stats.py": _STATS_BASE + '''

def variance(xs):
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)
'''},
         "tests": {"tests/test_variance.py": '''from stats import variance


def test_variance():
    assert variance([1, 1, 1]) == 0
    assert variance([1, 3]) == 1
'''}}],
    "combined": {"stats.py": '''def mean(xs, weights=None):
    if not xs:
        raise ValueError("mean of no values")
    if weights is None:
        return sum(xs) / len(xs)
    return sum(w * x for w, x in zip(weights, xs)) / sum(weights)


def median(xs):
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2


def mode(xs):
    counts = {}
    for x in xs:
        counts[x] = counts.get(x, 0) + 1
    best = max(counts.values())
    return min(x for x, c in counts.items() if c == best)


def variance(xs):
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)
'''}}

SPLITS = {"train": ["textkit_task/task1", "inventory_task/task1", "settings_task/task1"],
          "test": ["stats_task/task1"]}


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
    for name, spec in REPOS.items():
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
    with open(os.path.join(a.out, "splits.json"), "w") as f:
        json.dump(SPLITS, f, indent=1)
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
