"""The house's layout: no import cycle anywhere in scope/ (function-level imports included: a cycle that
only works because one side imports late is still a cycle), no module too big to hold in one's head, and no
function over a hundred lines."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "scope")
MAX_LINES = 600
DATA_TABLES: set[str] = set()  # modules that are data tables and may be longer (none today)


def modules() -> dict[str, str]:
    out = {}
    for dp, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dp, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(open(path).read())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                while t and t not in mods:  # `import scope.envs.lab` names the module; a.b.c -> its module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_scope():
    found = cycles(import_graph())
    graph = import_graph()
    detail = ["; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in found]
    assert not found, "import cycles:\n" + "\n".join(detail)


def test_no_module_is_too_big():
    big = {os.path.relpath(p, ROOT): n for p in modules().values()
           if (n := sum(1 for _ in open(p))) > MAX_LINES and os.path.relpath(p, ROOT) not in DATA_TABLES}
    assert not big, f"modules over {MAX_LINES} lines (split them by job): {big}"


MAX_FUNCTION_LINES = 100


def long_functions(source: str) -> dict[str, int]:
    """Every function (nested ones too) longer than MAX_FUNCTION_LINES lines, docstring and body included."""
    fns = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return {n.name: n.end_lineno - n.lineno + 1 for n in fns if n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES}


def test_the_function_length_rule_finds_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n") == {"f": MAX_FUNCTION_LINES + 1}
    assert long_functions("def g():\n    return 1\n") == {}


def test_no_function_is_over_a_hundred_lines():
    long = {}
    for p in sorted(modules().values()):
        for name, n in long_functions(open(p).read()).items():
            long[f"{os.path.relpath(p, ROOT)}:{name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (give their steps names of their own): {long}"


def test_the_core_imports_no_recipe_and_names_no_experiment():
    """scope/ is the library: no module of it imports ``recipes`` (an experiment plugs in by import path, never
    the reverse), and none names an experiment (its paradigms, signatures or narration live in its recipe)."""
    import re

    importing, naming = [], []
    for name, path in modules().items():
        source = open(path).read()
        for node in ast.walk(ast.parse(source)):
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            importing += [f"{name}: {t}" for t in targets if t == "recipes" or t.startswith("recipes.")]
        if re.search(r"pitch|p4g_mini|p4g-mini|collapse lab|signature [0-9]", source, re.IGNORECASE):
            naming.append(name)
    assert not importing, f"scope imports recipes: {importing}"
    assert not naming, f"scope modules that name an experiment: {naming}"


def test_the_grid_package_names_no_arm():
    """scope/grid/ is generic: no string in it is the name of an arm of any recipe's grid (an arm is special
    only through its recipe's grid.yaml and hooks)."""
    import glob

    import yaml

    arms = {"base", "single", "ensemble", "persona", "vs", "cotrain", "population"}
    for path in glob.glob(os.path.join(ROOT, "recipes", "*", "configs", "grid.yaml")):
        arms |= set(yaml.safe_load(open(path))["arms"])
    found = []
    for name, path in modules().items():
        if not name.startswith("scope.grid"):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in arms:
                found.append(f"{name}:{node.lineno}: {node.value!r}")
    assert not found, f"arm names in scope/grid: {found}"


def test_every_data_file_of_the_package_ships_in_its_wheel():
    """Each non-Python file under scope/ (tracked by git) is matched by pyproject.toml's package-data: a file the
    code reads that the wheel leaves out fails only in an installed copy (``make test-core`` found one)."""
    import glob
    import subprocess
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    shipped = set()
    for pkg, patterns in data.items():
        base = os.path.join(ROOT, *pkg.split("."))
        for pat in patterns:
            shipped |= {os.path.relpath(os.path.join(base, p), ROOT)
                        for p in glob.glob(pat, root_dir=base, recursive=True) if os.path.isfile(os.path.join(base, p))}
    tracked = subprocess.run(["git", "ls-files", "scope"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    missing = [p for p in tracked
               if not p.endswith(".py") and p not in shipped and os.path.exists(os.path.join(ROOT, p))]
    assert not missing, f"files under scope/ that no package-data pattern of pyproject.toml ships: {missing[:10]}"
