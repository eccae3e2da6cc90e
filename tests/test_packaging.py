"""The package installs quietly: the editable build (what `make install` runs through pip) emits no
setuptools warning about the package layout."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_editable_build_prints_no_warning(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 68:
        pytest.skip("the project builds with setuptools >= 68")
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "runs", "build", "*.egg-info",
                                                             "__pycache__", ".pytest_cache"))
    out = tmp_path / "wheel"
    out.mkdir()
    code = ("import setuptools.build_meta as b, sys; "
            "print(b.build_editable(sys.argv[1]))")
    r = subprocess.run([sys.executable, "-W", "always", "-c", code, str(out)], cwd=src, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith(".whl")
    warnings = [ln for ln in r.stderr.splitlines() if "Warning" in ln or "careful" in ln.lower()]
    assert not warnings, "\n".join(warnings)
