"""The lab's models as the recipe ships them (``prebuilt/``): the ones its configs and panel name, built once and
copied into the cache instead of trained again (about 9 minutes here), each checked against the sha256 of its
weights in ``prebuilt/manifest.json``. A model is shipped under its cache key, which hashes the code and texts
that shape it, so a change to them simply builds anew. ``python -m recipes.collapse_lab models --write`` ships
what the configs name; ``--check`` rebuilds every shipped model from its corpus in a scratch cache and compares
its weights, byte for byte."""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import tempfile
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
PREBUILT = os.path.join(HERE, "prebuilt")
MANIFEST = os.path.join(PREBUILT, "manifest.json")
FILES = ("config.json", "generation_config.json", "lab.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json", "chat_template.jinja")


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def manifest() -> dict[str, dict]:
    if not os.path.exists(MANIFEST):
        return {}
    with open(MANIFEST) as f:
        return json.load(f)


def restore(out: str) -> bool:
    """Copy the shipped model whose directory name is ``out``'s (``<kind>-<key>``) to ``out``, its weights checked;
    False where none is shipped under that key (or ``SCOPE_LAB_PREBUILT=0``)."""
    name = os.path.basename(out)
    entry = manifest().get(name)
    src = os.path.join(PREBUILT, name)
    if entry is None or os.environ.get("SCOPE_LAB_PREBUILT") == "0" or not os.path.isdir(src):
        return False
    got = sha256(os.path.join(src, "model.safetensors"))
    if got != entry["sha256"]:
        raise RuntimeError(f"{src}: its weights' sha256 is {got[:12]}, the manifest says {entry['sha256'][:12]}")
    tmp = f"{out}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    try:
        os.replace(tmp, out)
    except OSError:  # another process put it there first
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def named_models(configs: str) -> list[tuple[str, dict]]:
    """Every ``lab:`` model (name, options) the lab's configs and panel name."""
    import yaml

    from scope.configfile import load_config

    found: dict[str, tuple[str, dict]] = {}
    for path in sorted(glob.glob(os.path.join(configs, "*.yaml"))):
        if os.path.basename(path) in ("grid.yaml", "common.yaml"):
            continue
        if os.path.basename(path) == "panel.yaml":
            models = {k: v for k, v in (yaml.safe_load(open(path)).get("models") or {}).items()}
            items = [(m["path"], m.get("options") or {}) for m in models.values()]
        else:
            items = [(m.path, m.options) for m in load_config(path).models.values()]
        for p, opts in items:
            if p.startswith("lab:"):
                found[json.dumps([p, opts], sort_keys=True)] = (p.split(":", 1)[1], dict(opts))
    return list(found.values())


def write(configs: str, log: Callable[[str], None] = print) -> dict[str, dict]:
    """Build (or find in the cache) every model the configs name, with the shared base, and ship them."""
    from .models import build, build_base

    outs = [build_base(log)] + [build(name, opts, log) for name, opts in named_models(configs)]
    os.makedirs(PREBUILT, exist_ok=True)
    man = {}
    for out in outs:
        name = os.path.basename(out)
        dst = os.path.join(PREBUILT, name)
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(dst)
        for f in FILES:
            if os.path.exists(os.path.join(out, f)):
                shutil.copy2(os.path.join(out, f), dst)
        info = json.load(open(os.path.join(out, "lab.json")))
        man[name] = {"kind": info["kind"], "options": info.get("options", {}),
                     "sha256": sha256(os.path.join(dst, "model.safetensors"))}
    for stale in set(os.listdir(PREBUILT)) - set(man) - {"manifest.json"}:
        shutil.rmtree(os.path.join(PREBUILT, stale), ignore_errors=True)
    with open(MANIFEST, "w") as f:
        json.dump(man, f, indent=1, sort_keys=True)
    log(f"models: shipped {len(man)} models in {PREBUILT}")
    return man


def check(log: Callable[[str], None] = print) -> dict[str, bool]:
    """Rebuild every shipped model from its corpus in a scratch cache (the shipped copies not used) and compare
    its weights with the manifest's sha256: True where they are byte for byte the same."""
    from .models import build, build_base

    old = {k: os.environ.get(k) for k in ("SCOPE_CACHE", "SCOPE_LAB_PREBUILT")}
    scratch = tempfile.mkdtemp()
    os.environ.update(SCOPE_CACHE=scratch, SCOPE_LAB_PREBUILT="0")
    try:
        out = {}
        for name, entry in manifest().items():
            built = build_base(log) if entry["kind"] == "base" else build(entry["kind"], entry["options"], log)
            weights = sha256(os.path.join(built, "model.safetensors"))
            same = os.path.basename(built) == name and weights == entry["sha256"]
            out[name] = same
            log(f"models: {name}: {'the same bytes' if same else 'DIFFERENT'}")
        return out
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(scratch, ignore_errors=True)
