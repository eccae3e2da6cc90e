"""A grid's finished runs as committable records (``scope grid --records DIR``).

A grid on a small machine takes longer than one sitting, and a run directory does not outlive the machine it
was written on. :func:`pack` writes each finished run of a grid as ``DIR/<arm>-seed<k>.tar.gz``:
everything the tables, curves and verdicts read (``config.yaml``, ``metrics.jsonl``, ``eval/``, ``rollouts/``,
``best/best.json``), without weights (``checkpoints/`` and the best checkpoint's adapter: tens of MB a run),
unless the grid's ``records: {adapters: fp16}`` asks for the last checkpoint's LoRA adapters in half precision
(``final_adapters/``).
The archives are byte-for-byte reproducible (sorted members, no timestamps or owners), so packing a grid again
changes no committed file whose run did not change. :func:`unpack` puts them back under a grid's directory,
where :func:`scope.grid.runner.run_grid` counts them as done and aggregates them with the runs made since; a
run directory already there is never overwritten. A record without ``final_adapters/`` has no weights:
``scope eval`` on a recorded run's policy needs the run made again.
"""
from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import tarfile

import yaml

from .spec import GridSpec

SKIP = ("checkpoints", "tb")
"""Top-level folders of a run directory left out of its record (weights; TensorBoard's copy of metrics.jsonl)."""
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
"""Weight files are left out wherever they are (``best/`` keeps its ``best.json``, not the adapter)."""
FINAL = "final_adapters"
"""Where a record keeps its run's final LoRA adapters (``records: {adapters: fp16}``)."""
NAME = re.compile(r"^(?P<arm>[a-z0-9_]+)-seed(?P<seed>\d+)\.tar\.gz$")


def finished(run_dir: str, steps: int) -> bool:
    """Whether ``run_dir``'s metrics reach step ``steps`` (0 for a run that evaluates the policy as built, whose
    one line is that evaluation), or a ``stop`` alarm ended the run before it (``scope.alarms``)."""
    from ..run import read_metrics

    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return False
    try:
        return any(m.get("step") == steps or m.get("stop_reason") for m in read_metrics(path))
    except (ValueError, OSError):
        return False


def planned_steps(run_dir: str, arm: str, spec: GridSpec | None = None) -> int | None:
    """The steps a run of ``arm`` ends at: the grid's for the arm where it sets them, else its saved config's
    ``train.steps`` (read as plain YAML: no environment need be registered); None without a config."""
    if spec is not None and arm in spec.arms and spec.arms[arm].steps is not None:
        return spec.arms[arm].steps
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    return int((data.get("train") or {}).get("steps", 0))


def finished_runs(grid: str, spec: GridSpec | None = None) -> list[tuple[str, int, str]]:
    """``(arm, seed, run dir)`` of every finished run under ``grid``: each run with the metrics line of its last
    step (:func:`planned_steps`)."""
    out: list[tuple[str, int, str]] = []
    if not os.path.isdir(grid):
        return out
    for arm in sorted(os.listdir(grid)):
        adir = os.path.join(grid, arm)
        if not os.path.isdir(adir):
            continue
        for name in sorted(os.listdir(adir)):
            m = re.fullmatch(r"seed(\d+)", name)
            run_dir = os.path.join(adir, name)
            steps = planned_steps(run_dir, arm, spec) if m else None
            if steps is not None and finished(run_dir, steps):
                out.append((arm, int(m.group(1)), run_dir))  # type: ignore[union-attr]
    return out


def final_adapters(run_dir: str) -> dict[str, bytes]:
    """``final_adapters/...`` path -> bytes: each LoRA adapter (a folder with ``adapter_config.json`` and
    ``adapter_model.safetensors``) of the run's last checkpoint, its floating-point tensors in half precision, and
    ``step.txt`` (that checkpoint's step); a run restored from such a record (no checkpoints) gives back the
    files it was restored with. Empty where the run has neither."""
    ck = os.path.join(run_dir, "checkpoints")
    steps = sorted(d for d in os.listdir(ck) if re.fullmatch(r"step_\d+", d)) if os.path.isdir(ck) else []
    out: dict[str, bytes] = {}
    if not steps:
        kept = os.path.join(run_dir, FINAL)
        for root, _, files in os.walk(kept):
            for fn in files:
                with open(os.path.join(root, fn), "rb") as f:
                    out[os.path.relpath(os.path.join(root, fn), run_dir)] = f.read()
        return out
    import torch
    from safetensors.torch import load_file, save

    last = os.path.join(ck, steps[-1])
    for root, dirs, files in os.walk(last):
        dirs.sort()
        if "adapter_config.json" not in files or "adapter_model.safetensors" not in files:
            continue
        rel = os.path.join(FINAL, os.path.relpath(root, last))
        tensors = load_file(os.path.join(root, "adapter_model.safetensors"))
        half = {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in tensors.items()}
        out[os.path.normpath(os.path.join(rel, "adapter_model.safetensors"))] = save(half, metadata={"format": "pt"})
        with open(os.path.join(root, "adapter_config.json"), "rb") as f:
            out[os.path.normpath(os.path.join(rel, "adapter_config.json"))] = f.read()
    if out:
        out[os.path.join(FINAL, "step.txt")] = f"{int(steps[-1].split('_')[1])}\n".encode()
    return out


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _archive(run_dir: str, arcroot: str, adapters: str = "none") -> bytes:
    members: dict[str, bytes | str] = {}
    for root, dirs, files in os.walk(run_dir):
        rel = os.path.relpath(root, run_dir)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in SKIP and d != FINAL]
        dirs.sort()
        for fn in sorted(files):
            if fn.endswith(".tmp") or fn.endswith(WEIGHTS):
                continue
            members[os.path.normpath(os.path.join(rel, fn))] = os.path.join(root, fn)
    if adapters == "fp16":  # after the run's own files (whose order is that of records packed before this option)
        members.update(sorted(final_adapters(run_dir).items()))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, src in members.items():
            data = src if isinstance(src, bytes) else _read(src)
            info = tarfile.TarInfo(os.path.join(arcroot, rel))
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, filename="") as f:
        f.write(raw.getvalue())
    return gz.getvalue()


def pack(grid: str, dest: str, spec: GridSpec | None = None, only: tuple[str, int] | None = None) -> list[str]:
    """Write a record of every finished run of ``grid`` (or of the one run ``only = (arm, seed)``, if it is
    finished) into ``dest``; returns the paths written or rewritten (a record whose bytes would not change is left
    as it is)."""
    os.makedirs(dest, exist_ok=True)
    written = []
    for arm, seed, run_dir in finished_runs(grid, spec):
        if only is not None and (arm, seed) != only:
            continue
        data = _archive(run_dir, os.path.join(arm, f"seed{seed}"), spec.records.adapters if spec else "none")
        path = os.path.join(dest, f"{arm}-seed{seed}.tar.gz")
        if os.path.exists(path):
            with open(path, "rb") as f:
                if f.read() == data:
                    continue
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
        written.append(path)
    return written


def unpack(src: str, grid: str) -> list[str]:
    """Restore every record in ``src`` under ``grid`` whose run directory is not there yet; returns the run
    directories restored (none where ``src`` does not exist yet: :func:`pack` makes it). A record whose members
    leave its own ``arm/seedK/`` is refused."""
    restored: list[str] = []
    if not os.path.isdir(src):
        return restored
    for fn in sorted(os.listdir(src)):
        m = NAME.match(fn)
        if not m:
            continue
        root = os.path.join(m.group("arm"), "seed" + m.group("seed"))
        run_dir = os.path.join(grid, root)
        if os.path.exists(run_dir):
            continue
        with tarfile.open(os.path.join(src, fn), "r:gz") as tar:
            members = tar.getmembers()
            bad = [t.name for t in members if not t.isfile() or os.path.isabs(t.name) or ".." in t.name.split("/")
                   or not t.name.startswith(root + "/")]
            if bad:
                raise ValueError(f"{os.path.join(src, fn)}: members outside {root}/: {bad[:3]}")
            tmp = run_dir + ".unpack"
            shutil.rmtree(tmp, ignore_errors=True)  # a restore cut off earlier leaves nothing of its own in this one
            for t in members:
                target = os.path.join(tmp, os.path.relpath(t.name, root))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                fin = tar.extractfile(t)
                if fin is None:  # members were checked to be regular files
                    raise ValueError(f"{os.path.join(src, fn)}: {t.name} cannot be read")
                with fin, open(target, "wb") as fout:
                    fout.write(fin.read())
        os.makedirs(os.path.dirname(run_dir), exist_ok=True)
        os.replace(tmp, run_dir)
        restored.append(run_dir)
    return restored
