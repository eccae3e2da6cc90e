"""Every command the docs show is exercised: each `scope ...` subcommand answers --help, each config file
the docs name loads with the loader of its kind, each `make` target exists, each script answers --help,
`scope check-config` lines run whole, and the Python examples of CONTRIBUTING.md run as written."""
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CONTRIBUTING.md")] + \
    sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)) + \
    sorted(glob.glob(os.path.join(ROOT, "recipes", "**", "*.md"), recursive=True))
SCOPE = [sys.executable, "-m", "scope.cli"]


def blocks(lang: str) -> list[tuple[str, str]]:
    out = []
    for path in DOCS:
        text = open(path).read()
        for b in re.findall(rf"```{lang}\n(.*?)```", text, re.S):
            out.append((os.path.relpath(path, ROOT), b))
    return out


def commands() -> list[tuple[str, list[str]]]:
    """(doc, argv) of every shell line in a ```bash block (comments and continuations handled)."""
    out = []
    for doc, b in blocks("bash"):
        for line in b.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if not line or line.startswith("#"):
                continue
            line = re.sub(r"^(\w+=\S+\s+)+", "", line)  # leading VAR=value assignments
            try:
                argv = shlex.split(line)
            except ValueError:
                continue
            out.append((doc, argv))
    return out


def _scope_argv(argv: list[str]) -> list[str] | None:
    if not argv:
        return None
    if os.path.basename(argv[0]) == "scope":
        return argv[1:]
    if argv[:3] in (["python", "-m", "scope.cli"], [".venv/bin/python", "-m", "scope.cli"]):
        return argv[3:]
    return None


SUBCOMMANDS_WITH_ACTIONS = {"study", "personas"}  # `scope study serve`: the action is part of the command


def scope_commands() -> list[tuple[str, ...]]:
    found = set()
    for _, argv in commands():
        rest = _scope_argv(argv)
        if rest:
            cmd = tuple(rest[:2]) if rest[0] in SUBCOMMANDS_WITH_ACTIONS and len(rest) > 1 else (rest[0],)
            found.add(cmd)
    return sorted(found)


def named_configs() -> list[str]:
    found = set()
    for path in DOCS:
        here = os.path.relpath(os.path.dirname(path), ROOT)  # (a recipe's page names its own configs/ too)
        for p in re.findall(r"(?<![\w/])(?:recipes/\w+/)?configs/[\w/.-]+\.yaml\b", open(path).read()):
            inside = os.path.normpath(os.path.join(here, p))
            found.add(inside if here.startswith("recipes") and not p.startswith("recipes/")
                      and os.path.exists(os.path.join(ROOT, inside)) else p)
    return sorted(found)


def test_the_docs_show_commands_at_all():
    assert len(commands()) > 20 and ("train",) in scope_commands() and named_configs()


@pytest.mark.parametrize("cmd", scope_commands(), ids=" ".join)
def test_every_scope_command_in_the_docs_exists(cmd):
    r = subprocess.run(SCOPE + list(cmd) + ["--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, f"`scope {' '.join(cmd)}` (shown in the docs): {r.stderr[-500:]}"


@pytest.mark.parametrize("path", named_configs())
def test_every_config_the_docs_name_loads(path):
    """Training configs through `scope check-config`; panels, study and persona-search configs through their
    own loaders."""
    full = os.path.join(ROOT, path)
    assert os.path.exists(full), f"the docs name {path}, which does not exist"
    if "/panels/" in path or path.endswith("/panel.yaml"):
        from scope.eval import load_panel

        load_panel(full)
    elif "/study/" in path:
        from scope.study.config import load_study

        load_study(full)
    elif "/personas/" in path:
        from scope.personas.config import load_search_config

        load_search_config(full)
    elif path.endswith("/grid.yaml"):  # a grid's arms, hooks and run order
        from scope.grid.spec import hook, read_spec

        spec = read_spec(os.path.dirname(full))
        assert spec.plan() and all(hook(h) for h in [*spec.hooks.before.values(), *spec.hooks.sections])
    else:
        r = subprocess.run(SCOPE + ["check-config", full], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 0, f"{path}: {r.stderr[-500:]}"


def test_every_recipe_command_in_the_docs_answers_help():
    """`python -m recipes.<name> <command>` lines (a recipe's own entry point) exist as shown."""
    shown = sorted({tuple(argv[2:4]) for _, argv in commands() if len(argv) > 3 and argv[0].endswith("python")
                    and argv[1] == "-m" and argv[2].startswith("recipes.")})
    assert ("recipes.collapse_lab", "sweep") in shown
    for mod, cmd in shown:
        r = subprocess.run([sys.executable, "-m", mod, cmd, "--help"], capture_output=True, text=True, cwd=ROOT,
                           timeout=120)
        assert r.returncode == 0, f"python -m {mod} {cmd} --help: {r.stderr[-500:]}"


def test_every_make_target_in_the_docs_exists():
    targets = set(re.findall(r"^([\w-]+):", open(os.path.join(ROOT, "Makefile")).read(), re.M))
    shown = {argv[1] for _, argv in commands() if argv[0] == "make" and len(argv) > 1}
    shown |= {t for path in DOCS for t in re.findall(r"`make ([\w-]+)`", open(path).read())}
    assert shown and shown <= targets, f"make targets the docs show but the Makefile lacks: {sorted(shown - targets)}"


def test_every_script_in_the_docs_answers_help():
    scripts = sorted({a for _, argv in commands() for a in argv if re.fullmatch(r"(benchmarks|tools)/\w+\.py", a)})
    assert scripts
    for s in scripts:
        assert os.path.exists(os.path.join(ROOT, s)), s
        r = subprocess.run([sys.executable, s, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert r.returncode == 0, f"{s} --help: {r.stderr[-500:]}"


def test_check_config_lines_run_whole():
    lines = [argv for _, argv in commands() if (_scope_argv(argv) or [""])[0] == "check-config"]
    assert lines
    for argv in lines:
        r = subprocess.run(SCOPE + _scope_argv(argv), capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 0, f"{' '.join(argv)}: {r.stderr[-500:]}"


@pytest.mark.parametrize("i", range(len(blocks("python"))))
def test_the_python_examples_run(i, tmp_path):
    doc, code = blocks("python")[i]
    path = tmp_path / "example.py"
    path.write_text(code)
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, f"an example in {doc}: {r.stderr[-1500:]}"


def test_the_config_reference_is_generated_from_the_code():
    """docs/configs.md's key table is scope/config.py's fields (types, defaults, docstrings) and every
    environment's options, as `python -m scope.configdoc` writes them: a field changed in the code and not in
    the docs (or the reverse) fails here."""
    from scope import configdoc
    from scope.config import Config

    ref = configdoc.reference()
    assert configdoc.documented() == ref, "run python -m scope.configdoc --write"
    assert "| `models.<name>.dtype` | auto / float32 / bfloat16 / float16 | `auto` |" in ref
    for key in ("models.<name>.device", "models.<name>.vllm.max_loras", "rollout.workers", "ray.address",
                "diagnostics.probe_every", "parallel.timeout"):
        assert f"| `{key}` |" in ref, key
    assert set(Config.model_fields) <= {line.split("`")[1].split(".")[0] for line in ref.splitlines()
                                        if line.startswith("| `") and "." in line.split("`")[1]} | {
        "models", "agent", "partner", "envsim"}


def test_the_module_map_names_every_module_of_the_tree():
    """docs/internals.md's map of scope/ is written from the tree: every top-level module and every package is
    named in it, and nothing it names at the top level is missing."""
    import re

    text = open(os.path.join(ROOT, "docs", "internals.md")).read()
    block = text[text.index("```\nscope/"):text.index("```", text.index("```\nscope/") + 4)]
    pkg = os.path.join(ROOT, "scope")
    tree = {n for n in os.listdir(pkg) if n.endswith(".py") and n != "__init__.py"} | \
        {n + "/" for n in os.listdir(pkg) if os.path.isfile(os.path.join(pkg, n, "__init__.py"))}
    named = set(re.findall(r"^  ([\w/]+(?:\.py|/))", block, re.M)) | set(re.findall(r"(\w+\.py)", block))
    assert tree - named == set(), f"modules of scope/ missing from docs/internals.md's map: {sorted(tree - named)}"
    top = set(re.findall(r"^  ([\w]+(?:\.py|/))\s", block, re.M))
    assert top - tree == set(), f"the map names what the tree does not have: {sorted(top - tree)}"


def test_every_relative_link_in_the_docs_resolves():
    import re

    bad = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", open(doc).read()):
            if "://" in target or target.startswith("#") or target.startswith("mailto:"):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(doc), target.split("#")[0]))
            if not os.path.exists(path):
                bad.append(f"{os.path.relpath(doc, ROOT)}: {target}")
    assert not bad, bad


def test_help_shows_the_first_commands_first_and_every_command_in_a_group():
    r = subprocess.run(SCOPE + ["--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0
    first = r.stdout[r.stdout.index("first:"):].splitlines()[1:7]
    assert [ln.split()[0] for ln in first] == ["train", "eval", "serve", "check-config", "plot", "grid"]
    from scope.cli import parser

    sub = next(a for a in parser()._actions if a.dest == "cmd")
    listed = {ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("  ") and not ln.startswith("   ")}
    assert set(sub.choices) <= listed
