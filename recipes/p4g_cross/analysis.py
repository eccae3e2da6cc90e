"""P4G-pitch across families, around its grid: the Gemma fits, the pilot (P4G-pitch's, under this panel, with G1's
go/no-go and the two families' correlation), the fidelity cards, and P4G-pitch's recorded pitches re-scored
under the Gemma simulators."""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from typing import Any, Callable

import numpy as np

from recipes.p4g_pitch import pilot as pitch
from scope.stats import fmt

SIMS = "runs/p4g-cross/sims"
RECORDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")
SMOL, GEMMA = ("T0", "P1", "P2", "P3", "P4"), ("G1", "G3", "G4")
"""The members whose mean per pitch stands for each family in the pilot's correlation."""
BASE = "single_p1.yaml"  # the config whose persuader samples (the untrained policy of every arm)


def gemma_model(k: int):
    from scope.config import ModelConfig

    return ModelConfig(path="gemma3-270m", adapter=os.path.join(SIMS, f"g{k}", "adapter"))


def fit_sims(data_dir: str, only: list[str] | None = None, log: Callable[[str], None] = print) -> None:
    """G1-G4: Gemma 3 270M base fitted to the four quarters of the train persuadees by P1-P4's recipe (its examples
    and options; only the model differs), and P1-P4 restored from P4G-pitch's records."""
    from recipes.p4g_pitch.__main__ import restore_fit
    from recipes.p4g_pitch.__main__ import sims as pitch_sims
    from scope.sim.fit import FitConfig, fit

    pitch_sims(data_dir)
    for k in (1, 3, 4, 2):  # the training simulator and the panel's first; G2 is for its fidelity card only
        if only and f"g{k}" not in only:
            continue
        out, record = os.path.join(SIMS, f"g{k}"), os.path.join(RECORDS, "sims", f"g{k}")
        if restore_fit(out, record, f"G{k}", log):
            continue
        fit(FitConfig(model="gemma3-270m", data_dir=data_dir, shard=f"{k}/4",
                      examples="recipes.p4g_pitch.fit:fit_views", max_tokens=512, out=out), log=log, progress=False)
        if not os.path.isdir(record):  # kept with the recipe as soon as it is made (a fit takes the better part
            # of an hour here): the adapter and its fit.json, nothing else of the run
            os.makedirs(record)
            shutil.copytree(os.path.join(out, "adapter"), os.path.join(record, "adapter"))
            shutil.copy2(os.path.join(out, "fit.json"), record)
            log(f"sims: G{k} kept in {record}")


def pilot(configs: str, out: str, n_sampled: int = 256, n_personas: int = 4, overrides: list[str] | None = None,
          log: Callable[[str], None] = print) -> dict[str, Any]:
    """P4G-pitch's pilot under this panel (and G1): G1's spread is the go/no-go of the mirror arm; then the Spearman
    correlation of the SmolLM2 family's pitch scores with the Gemma family's, appended to ``pilot.md``."""
    res = pitch.pilot(configs, out, n_sampled=n_sampled, n_personas=n_personas, overrides=overrides, log=log,
                      base=BASE, reference="G1", unseen=("P3", "P4", "G3", "G4"))
    fam = family_correlation(res["scores"], n_sampled)
    res["families"] = fam
    with open(os.path.join(out, "pilot.json"), "w") as f:
        json.dump(res, f, indent=1, default=float)
    with open(os.path.join(out, "pilot.md"), "a") as f:
        f.write(f"\nThe two families (each pitch's mean score over the members of a family, the sampled pitches): "
                f"SmolLM2 ({', '.join(fam['smollm2'])}) against Gemma ({', '.join(fam['gemma'])}), Spearman "
                f"{fmt(fam['spearman'], 2)}; per member pair, the table above.\n")
    log(f"pilot: the families' Spearman correlation {fam['spearman']:.2f}")
    return res


def family_correlation(scores: dict[str, dict[str, Any]], n_sampled: int) -> dict[str, Any]:
    """The Spearman correlation, over the sampled pitches, of the SmolLM2 members' mean score with the Gemma
    members' (each pitch's score: its mean over the pilot's personas)."""
    def fam_mean(ids):
        ids = [i for i in ids if i in scores]
        per = [np.nanmean(np.asarray(scores[i]["rewards"], dtype=float)[:n_sampled], axis=1) for i in ids]
        return ids, np.mean(per, axis=0)

    s_ids, s = fam_mean(SMOL)
    g_ids, g = fam_mean(GEMMA)
    return {"smollm2": s_ids, "gemma": g_ids, "spearman": pitch._spearman(s, g)}


def cards(configs: str, out: str, n_dialogues: int = 48, overrides: list[str] | None = None,
          log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fidelity cards of every forced-decision simulator of this recipe, G2 (no config's) among them."""
    return pitch.fidelity(configs, out, n_dialogues=n_dialogues, overrides=overrides, log=log, base=BASE,
                          extra={"G2": gemma_model(2)})


def rescore(configs: str, records: str, out: str, overrides: list[str] | None = None,
            log: Callable[[str], None] = print, keep: str | None = None, final_only: bool = False) -> dict[str, Any]:
    """Every evaluation pitch of P4G-pitch's committed records (every run, every evaluation step) re-scored under
    G1-G4, beside the P3/P4 reward each run recorded; every run's final step paired with Base's step 0 on P3/P4
    and on G3/G4. Each evaluation's scores are kept as soon as they are made (``keep``, by default
    ``records/rescore`` of this recipe: a rerun scores only what is missing), final steps and Base first
    (``final_only``: those alone). Writes ``rescore.json`` and ``rescore.md``."""
    from scope.envs.tasks import load_tasks
    from scope.grid.records import unpack
    from scope.grid.summary import eval_cells
    from scope.stats import cells_of

    keep = keep or os.path.join(RECORDS, "rescore")
    os.makedirs(keep, exist_ok=True)
    tmp = tempfile.mkdtemp()
    loaded: dict[str, Any] = {}
    runs: dict[str, dict[str, Any]] = {}
    try:
        unpack(records, tmp)
        todo = []  # (order, run name, step, run dir)
        for arm in sorted(os.listdir(tmp)):
            for seed in sorted(os.listdir(os.path.join(tmp, arm))):
                run_dir = os.path.join(tmp, arm, seed)
                cells, _, _, _ = eval_cells(run_dir)
                if final_only:
                    cells = {max(cells): cells[max(cells)]}
                runs[f"{arm}/{seed}"] = {"cells": {str(k): v for k, v in cells.items()}}
                todo += [(0 if step == max(cells) else 1, f"{arm}/{seed}", step, run_dir) for step in cells]
        for _, name, step, run_dir in sorted(todo, key=lambda x: (x[0], x[1], x[2])):
            path = os.path.join(keep, f"{name.replace('/', '-')}-step{step}.json")
            if not os.path.exists(path):
                if not loaded:
                    cfg, _, _, sims = pitch.load(configs, overrides, BASE, {"G2": gemma_model(2)})
                    loaded.update(cfg=cfg, gem={k: sims[k] for k in ("G1", "G2", "G3", "G4")},
                                  tasks={t.id: t for t in load_tasks(cfg.env, "test")})
                pairs = _pitches(os.path.join(run_dir, "eval", f"step_{step:06d}", "eval_episodes.jsonl"),
                                 loaded["tasks"])
                scores = pitch.score_pairs(loaded["cfg"], pairs, loaded["gem"], seed=0)
                kept = {"run": name, "step": step, "tasks": [t.id for _, t in pairs],
                        "rewards": {k: v["rewards"] for k, v in scores.items()}}
                with open(path + ".tmp", "w") as f:
                    json.dump(kept, f, default=float)
                os.replace(path + ".tmp", path)
                log(f"rescore: {name} step {step}: " + ", ".join(
                    f"{k} {np.nanmean(v['rewards']):.3f}" for k, v in scores.items()))
            with open(path) as f:
                kept = json.load(f)
            recs = [{"task_id": t, "group_id": f"{sid}:{i}", "status": "done", "rewards": {"agent": r},
                     "meta": {"partner": sid}}
                    for sid, rs in kept["rewards"].items() for i, (t, r) in enumerate(zip(kept["tasks"], rs))
                    if r is not None and not math.isnan(r)]
            runs[name]["cells"][str(step)].update(cells_of(recs))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summarise(runs)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "rescore.json"), "w") as f:
        json.dump(runs, f, indent=1, default=float)
    with open(os.path.join(out, "rescore.md"), "w") as f:
        f.write(rescore_markdown(runs))
    return runs


def summarise(runs: dict[str, dict[str, Any]]) -> None:
    """Each run's final step against Base's step 0, per group of members (bootstrap over the test personas), and
    the groups' means at every evaluation step."""
    from scope.stats import task_bootstrap

    base = runs.get("base/seed0", {}).get("cells", {}).get("0")
    for r in runs.values():
        r["final_step"] = max(int(s) for s in r["cells"])
        last = r["cells"][str(r["final_step"])]
        r["groups"] = {"/".join(g): {"run": task_bootstrap([last], list(g)),
                                     **({"vs_base": task_bootstrap([last], list(g), minus=[base])} if base else {})}
                       for g in (("P3", "P4"), ("G3", "G4"), ("G1", "G2"), ("P1", "P2"))}
        r["by_step"] = {s: {"/".join(g): float(np.mean([np.mean(list(c[m].values())) for m in g if m in c]))
                            for g in (("P3", "P4"), ("G3", "G4"))}
                        for s, c in sorted(r["cells"].items(), key=lambda x: int(x[0]))}


def _pitches(path: str, tasks: dict[str, Any]) -> list[tuple[str, Any]]:
    """The distinct (pitch, task) pairs an evaluation scored (paired: the first member's episodes carry them)."""
    seen: dict[tuple[str, int], str] = {}
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            said = [m["content"] for m in e["messages"] if m["role"] == "agent"]
            if said and e.get("status") != "failed":
                seen.setdefault((e["task_id"], e["copy"]), said[0])
    return [(p, tasks[t]) for (t, _), p in sorted(seen.items())]


def rescore_markdown(runs: dict[str, Any]) -> str:
    def iv(x: dict[str, float], sign: bool = False) -> str:
        f = (lambda v: f"{v:+.3f}") if sign else (lambda v: f"{v:.3f}")
        return f"{f(x['mean'])} [{f(x['lo'])}, {f(x['hi'])}]"

    lines = ["# P4G-pitch's recorded runs under the Gemma family", "",
             "Every evaluation pitch of P4G-pitch's committed records re-scored under G1-G4 (Gemma 3 270M base fitted "
             "to the quarters P1-P4 were fitted to); P3/P4 as each run recorded it. Final step; 95% bootstrap "
             "over the 48 test personas; the gain is paired with Base's step 0.", "",
             "| run | final step | P3/P4 | gain on P3/P4 | G3/G4 | gain on G3/G4 | G1/G2 |", "|---" * 7 + "|"]

    def gain(g: dict[str, Any], k: str) -> str:
        return iv(g[k]["vs_base"], True) if "vs_base" in g[k] else "n/a"

    for name, r in runs.items():
        g = r["groups"]
        lines.append(f"| {name} | {r['final_step']} | {iv(g['P3/P4']['run'])} | {gain(g, 'P3/P4')} | "
                     f"{iv(g['G3/G4']['run'])} | {gain(g, 'G3/G4')} | {iv(g['G1/G2']['run'])} |")
    lines += ["", "By evaluation step (P3/P4, G3/G4):", ""]
    for name, r in runs.items():
        lines.append(f"- {name}: " + "; ".join(f"{s}: {v['P3/P4']:.3f}, {v['G3/G4']:.3f}"
                                               for s, v in r["by_step"].items()))
    return "\n".join(lines) + "\n"
