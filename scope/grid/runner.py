"""``scope grid``: an experiment's arms x seeds (``grid.yaml``, :mod:`scope.grid.spec`), each run an ordinary
``scope train`` run in ``OUT/<arm>/seed<k>/`` with its held-out panel evaluated at step 0 and every
``eval.every`` steps. A finished run is not run again, so an interrupted grid continues where it stopped; a run
cut off before its first checkpoint starts over. At the end the grid writes:

- ``results.json``: per run, the final panel scores and the curves; per arm, means, intervals and seeds;
- ``table.md``: per arm the held-out reward on seen / unseen / all simulators with its task-bootstrap interval
  and each seed's value, the training reward (last 4 steps), entropy, zero-variance and the variance
  decomposition; per simulator the same reward; then the sections of the grid's hooks;
- ``curves.png`` (and one PNG per curve): training reward, held-out reward on the unseen simulators, policy
  entropy, zero-variance fraction and the simulator's behaviour modal mass, per arm, averaged over seeds;
- ``dialogues.md``: what each arm's agent says at its last evaluation.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Any, Callable

from ..run import eta
from ..stats import fmt
from .records import finished, pack, unpack
from .spec import BeforeHook, GridSpec, Section, SectionHook, hook, read_spec


def run_grid(configs: str | GridSpec, out: str, arms: tuple[str, ...] | None = None, seeds: int | None = None,
             overrides: list[str] | None = None, quick: bool = False, log: Callable[[str], None] = print,
             records: str | None = None) -> dict[str, Any]:
    """Run the grid declared in ``configs`` (a directory with ``grid.yaml``) into ``out``; see the module's
    docstring. ``records``: a directory of run records (:mod:`scope.grid.records`): those missing from ``out``
    are restored first and count as done, and every run finished here is packed into it as it ends."""
    from ..configfile import load_config

    spec = configs if isinstance(configs, GridSpec) else read_spec(configs)
    overrides = list(overrides or [])
    if quick:
        seeds = min(seeds or spec.quick.seeds, spec.quick.seeds)
        overrides = spec.quick.set + overrides
    order = spec.plan(arms, seeds)
    chosen = [a for a in spec.arms if any(a == x for x, _ in order)]
    n_seeds = max((s for _, s in order), default=0) + 1
    os.makedirs(out, exist_ok=True)
    for d in unpack(records, out) if records else []:
        log(f"grid: restored {d} from {records}")
    t_all = time.time()
    first = load_config(spec.config_path(order[0][0] if order else next(iter(spec.arms))), overrides)
    if first.run.threads:  # models a hook builds, and every run, at the configured thread count
        import torch

        torch.set_num_threads(first.run.threads)
    warning = family_warning(spec, chosen, overrides)
    if warning:
        log(f"grid: WARNING: {warning}")
    before = {key: _before(out, key, path, first, log) for key, path in spec.hooks.before.items()}
    for arm, seed in order:
        _one(spec, out, arm, seed, overrides, records, log, t_all)
    for path in pack(out, records, spec) if records else []:  # runs finished before this invocation, too
        log(f"grid: packed {path}")
    results = finish(spec, out, chosen, n_seeds, overrides, before)
    results.update(quick=quick, env=first.env.name, seconds=time.time() - t_all)
    write_outputs(out, results)
    log(f"grid: wrote {out}/table.md, {out}/curves.png and {out}/results.json in {time.time() - t_all:.0f}s")
    return results


def _one(spec: GridSpec, out: str, arm: str, seed: int, overrides: list[str], records: str | None,
         log: Callable[[str], None], t_all: float) -> None:
    """One run of the grid: skipped when finished, started over when cut off before its first checkpoint, else
    trained (or resumed), then packed into ``records``."""
    from ..configfile import load_config
    from ..train import train

    run_dir = os.path.join(out, arm, f"seed{seed}")
    cfg = load_config(spec.config_path(arm), overrides + spec.overrides(arm, seed, run_dir))
    label = spec.label(arm)
    if finished(run_dir, cfg.train.steps):
        log(f"grid: {label} seed {seed}: done already ({run_dir})")
        return
    if os.path.exists(run_dir) and not os.path.exists(os.path.join(run_dir, "checkpoints")):
        shutil.rmtree(run_dir)  # a run cut off before its first checkpoint starts over
    t0 = time.time()
    log(f"grid: {label} seed {seed} ...")
    opening: list[int] = []  # the first step of this sitting (a resumed run's is not 1)

    def step_done(step: int, n: int = cfg.train.steps) -> None:
        opening[:] = opening or [step]
        log(f"grid: {label} seed {seed}: step {step}/{n} ({time.time() - t0:.0f}s, "
            f"{eta(time.time() - t0, step - opening[0] + 1, n - step)})")

    train(cfg, resume=os.path.exists(os.path.join(run_dir, "metrics.jsonl")), log=lambda s: None,
          on_step_end=step_done)
    from .summary import run_summary

    r = run_summary(run_dir)
    log(f"grid: {label} seed {seed}: held-out unseen {fmt(r.get('unseen'))}, seen {fmt(r.get('seen'))}, "
        f"train reward {fmt(r.get('train_reward'))} ({time.time() - t0:.0f}s; {time.time() - t_all:.0f}s so far)")
    for path in pack(out, records, spec, only=(arm, seed)) if records else []:  # its record, as soon as it ends
        log(f"grid: packed {path}")


def _before(out: str, key: str, path: str, cfg, log: Callable[[str], None]) -> dict[str, Any]:
    """A ``before`` hook's result, computed once per output directory (kept as ``<key>.json``)."""
    saved = os.path.join(out, f"{key}.json")
    if os.path.exists(saved):
        with open(saved) as f:
            return json.load(f)
    fn: BeforeHook = hook(path)
    data = fn(out, cfg, log)
    with open(saved, "w") as f:
        json.dump(data, f, indent=1)
    return data


def finish(spec: GridSpec, out: str, arms: list[str], seeds: int, overrides: list[str] | None = None,
           before: dict[str, Any] | None = None) -> dict[str, Any]:
    """The grid's results from the runs under ``out``: aggregated per arm, the ``before`` hooks' data, and the
    sections of the grid's hooks (each kept as ``results[section.key]``, its lines in ``results["sections"]``)."""
    import torch

    from .aggregate import aggregate

    results = aggregate(out, arms, seeds, same_weights(spec, arms, overrides or []))
    results.update(before or {})
    results.update(seeds=seeds, threads=torch.get_num_threads(), labels={a: spec.label(a) for a in arms})
    results["sections"] = []
    for path in spec.hooks.sections:
        fn: SectionHook = hook(path)
        section: Section = fn(results, spec)
        results[section.key] = section.data
        results["sections"].append(section.lines)
    return results


def _panel_sources(spec: GridSpec, arms: list[str], overrides: list[str]):
    """The grid's panel, the models its members can name, and every training simulator of its trained arms (None
    for a grid without a panel)."""
    from ..configfile import load_config
    from ..eval import load_panel
    from ..panels import training_simulators

    cfgs = [load_config(spec.config_path(a), overrides) for a in arms if spec.arms[a].steps != 0]
    if not cfgs or not cfgs[0].eval.panel:
        return None
    panel = load_panel(cfgs[0].eval.panel)
    return panel, {**cfgs[0].models, **panel.models}, [s for c in cfgs for s in training_simulators(c)]


def same_weights(spec: GridSpec, arms: list[str], overrides: list[str]) -> set[str]:
    """The panel's unseen simulators that run on the weights of a training simulator of any trained arm of the
    grid (``scope.panels``), marked in its tables."""
    from ..panels import same_weights as shared

    found = _panel_sources(spec, arms, overrides)
    return shared(*found) if found else set()


def family_warning(spec: GridSpec, arms: list[str], overrides: list[str]) -> str | None:
    """One line naming the trained arms for which every unseen member of the grid's panel is of a training
    simulator's model family (:func:`scope.panels.family_warning`), or None when there is none."""
    from ..configfile import load_config
    from ..eval import load_panel
    from ..panels import family_warning as warn, run_sharing

    found = []
    for a in arms:
        cfg = load_config(spec.config_path(a), overrides)
        if spec.arms[a].steps != 0 and cfg.eval.panel:
            line = warn(load_panel(cfg.eval.panel), run_sharing(cfg, load_panel(cfg.eval.panel)))
            if line:
                found.append((spec.label(a), line))
    if not found:
        return None
    return f"{', '.join(a for a, _ in found)}: {found[0][1]}"


def write_outputs(out: str, results: dict[str, Any]) -> None:
    from ..envs.base import get_env
    from .dialogues import dialogue_cards
    from .table import table

    labels = results["labels"]
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=float)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table(results, labels))
    env_cls = get_env(results["env"]) if results.get("env") else None
    with open(os.path.join(out, "dialogues.md"), "w") as f:
        f.write(dialogue_cards(out, labels, env_cls))
    try:
        from .curves import plot_curves

        plot_curves(out, results, labels)
    except ImportError:  # the core install: the tables and results.json, no figures
        print("grid: no curves.png (the figures need scope[plots]: pip install 'scope[plots]')", file=sys.stderr)
