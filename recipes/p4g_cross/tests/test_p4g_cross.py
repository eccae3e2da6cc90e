"""P4G-pitch across families at a tiny size: the pre-registered panel and its families, the grid (tiny-random as the
SmolLM2 family, tiny-gemma3 as the Gemma family, each simulator one quick `scope sim fit`), its family columns and
warnings, and every signature computed from it."""
import hashlib
import os
import shutil

import pytest
import yaml

from recipes.conftest import shared_path
from scope.grid.runner import run_grid

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
REGISTERED_RUNS = ["base", "single_p1", "single_g1", "ensemble", "single_p1@1", "single_g1@1", "ensemble@1"]
"""grid.yaml's runs as committed before the pilot."""
PREREGISTERED = "27cdc74aac232ab4aae46d41b9ef96fc21be4b1643ba60054d71fec5f17c1f64"
"""The panel as committed before any training run (README.md): it is not changed after a result."""


def test_the_panel_is_the_preregistered_one():
    from scope.configfile import load_config
    from scope.eval import load_panel
    from scope.panels import run_sharing

    with open(os.path.join(CONFIGS, "panel.yaml"), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == PREREGISTERED, "recipes/p4g_cross/configs/panel.yaml changed"
    panel = load_panel(os.path.join(CONFIGS, "panel.yaml"))
    groups = {p.spec_id(): "control" if p.control else "seen" if p.seen else "unseen" for p in panel.partners}
    assert groups == {"T0": "seen", "P1": "seen", "P2": "seen", "P3": "unseen", "P4": "unseen", "G3": "unseen",
                      "G4": "unseen", "base-T1.0": "control", "verbal": "control", "gemma-base": "control"}
    assert panel.paired and panel.tasks == 48 and panel.episodes == 96
    for arm, own, other in (("single_p1", "smollm2", "gemma3"), ("single_g1", "gemma3", "smollm2")):
        sh = run_sharing(load_config(os.path.join(CONFIGS, f"{arm}.yaml")), panel)
        fam = {k: (v.family_name, v.family) for k, v in sh.items() if k in ("P3", "P4", "G3", "G4")}
        mine = ("P3", "P4") if own == "smollm2" else ("G3", "G4")
        assert all(fam[k] == (own, True) for k in mine) and all(fam[k] == (other, False)
                                                                   for k in fam if k not in mine), (arm, fam)




@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p4g = shared_path("data", "p4g")
    from scope.sim.fit import FitConfig, fit

    tmp = tmp_path_factory.mktemp("cross")
    for model in ("tiny-random", "tiny-gemma3"):
        fit(FitConfig(model=model, data_dir=p4g, out=str(tmp / model), max_dialogues=2, max_tokens=512,
                      batch_tokens=512, epochs=0.5, shard="1/4", examples="recipes.p4g_pitch.fit:fit_views"),
            log=lambda s: None, progress=False)
    with open(os.path.join(CONFIGS, "panel.yaml")) as f:
        panel = yaml.safe_load(f)
    panel.update(tasks=2, episodes=4)
    for spec in panel["models"].values():
        spec["path"] = "tiny-gemma3" if spec["path"] == "gemma3-270m" else "tiny-random"
        if "adapter" in spec:
            spec["adapter"] = str(tmp / spec["path"] / "adapter")
    (tmp / "panel.yaml").write_text(yaml.safe_dump(panel))
    overrides = ["models.policy.path=tiny-random", f"eval.panel={tmp / 'panel.yaml'}", f"env.options.data_dir={p4g}",
                 "rollout.n_tasks=2", "rollout.group_size=2", "agent.max_new_tokens=4", "partner.max_new_tokens=4",
                 "train.steps=2", "eval.every=2", "run.save_every=2", "models.p1.path=tiny-random",
                 f"models.p1.adapter={tmp / 'tiny-random' / 'adapter'}", "models.g1.path=tiny-gemma3",
                 f"models.g1.adapter={tmp / 'tiny-gemma3' / 'adapter'}"]
    configs = tmp / "configs"  # the grid as registered before the pilot (its mirror arm included): the machinery
    shutil.copytree(CONFIGS, configs)
    spec = yaml.safe_load((configs / "grid.yaml").read_text())
    spec["runs"] = REGISTERED_RUNS
    (configs / "grid.yaml").write_text(yaml.safe_dump(spec))
    out = str(tmp / "grid")
    lines: list[str] = []
    res = run_grid(str(configs), out, overrides=overrides, log=lines.append)
    return tmp, out, res, lines


def test_the_mirror_arm_is_out_of_the_runs_after_the_pilots_no_go():
    """The pilot's go/no-go (README "Results") took RL (Single) on G1 out of the grid's runs; nothing else."""
    from scope.grid.spec import read_spec

    spec = read_spec(CONFIGS)
    registered = spec.model_copy(update={"runs": REGISTERED_RUNS}).plan()
    assert spec.plan() == [r for r in registered if r[0] != "single_g1"] and len(registered) == 7
    assert "single_g1" in spec.arms


def test_the_grid_reports_the_families_apart(tiny):
    _, out, res, lines = tiny
    assert set(res["arms"]) == {"base", "single_p1", "single_g1", "ensemble"}
    table = open(os.path.join(out, "table.md")).read()
    assert "unseen, another family" in table  # the panel has members of a family no training simulator is of
    assert res["arms"]["single_p1"]["per_simulator"]["G3"]["family"] == "tiny-gemma3"
    single = res["runs"]["single_p1"][0]
    assert single["families"]["P3"][1] is True and single["families"]["G3"][1] is False
    # the Ensemble trains on both families, so every unseen member is of one of its training families; each
    # RL (Single) meets the other family among its unseen members
    [warning] = [x for x in lines if "WARNING" in x]
    assert "Ensemble over {P1, G1}" in warning and "RL (Single)" not in warning


def test_every_signature_is_computed_from_the_grid(tiny):
    from recipes.p4g_cross.verdicts import verdicts

    _, out, _, _ = tiny
    v = verdicts(out, CONFIGS, log=lambda s: None)
    s = v["signatures"]
    assert s["family_gain"]["arms"]["single_g1"]["held"] in (True, False)
    assert set(s) == {"family_gain", "below_base_other_family", "worse_family_cure", "diversity"}
    for arm in ("single_p1", "single_g1"):
        rows = s["family_gain"]["arms"][arm]["seeds"]
        assert [r["seed"] for r in rows] == [0, 1] and all(isinstance(r["holds"], bool) for r in rows)
    assert len(s["worse_family_cure"]["comparisons"]) == 2 and s["worse_family_cure"]["held"] in (True, False)
    assert s["diversity"]["held"] in (True, False)
    assert "1. " in open(os.path.join(out, "verdicts.md")).read()


def test_rescore_keeps_each_evaluation_as_it_goes_final_steps_first(tmp_path, monkeypatch):
    """The rescoring of P4G-pitch's records (the scoring faked: no model is loaded) scores each recorded evaluation
    once, Base and the final steps first, keeps each as it finishes, and a rerun scores nothing again; every run's
    final step is paired with Base's step 0 on G3/G4."""
    import json
    import shutil
    import tarfile
    from types import SimpleNamespace

    import scope.envs.tasks
    from recipes.p4g_cross import analysis
    from recipes.p4g_pitch import pilot as pitch

    src = os.path.join(os.path.dirname(CONFIGS), "..", "p4g_pitch", "records")
    records = tmp_path / "records"
    records.mkdir()
    ids = set()
    for fn in ("base-seed0.tar.gz", "single-seed0.tar.gz"):
        shutil.copy(os.path.join(src, fn), records / fn)
        with tarfile.open(records / fn) as tar:
            for m in tar.getnames():
                if m.endswith("eval_episodes.jsonl"):
                    ids |= {json.loads(x)["task_id"] for x in tar.extractfile(m).read().decode().splitlines()}
    calls = []

    def score_pairs(cfg, pairs, sims, seed=0):
        calls.append(len(pairs))
        return {k: {"rewards": [0.1 * i + (len(p) % 3) / 10 for p, _ in pairs]} for i, k in enumerate(sims)}

    monkeypatch.setattr(pitch, "load", lambda *a, **k: (SimpleNamespace(env=None), None, None,
                                                        {g: None for g in ("G1", "G2", "G3", "G4")}))
    monkeypatch.setattr(pitch, "score_pairs", score_pairs)
    monkeypatch.setattr(scope.envs.tasks, "load_tasks", lambda env, split: [SimpleNamespace(id=i) for i in ids])
    lines: list[str] = []
    keep = tmp_path / "keep"
    runs = analysis.rescore(CONFIGS, str(records), str(tmp_path / "out"), log=lines.append, keep=str(keep))
    assert len(calls) == 6 and all(n == 96 for n in calls)  # Base's one evaluation and single's five, 96 pitches
    assert [x.split(":")[1].strip() for x in lines[:2]] == ["base/seed0 step 0", "single/seed0 step 40"]
    assert sorted(os.listdir(keep))[0] == "base-seed0-step0.json" and len(os.listdir(keep)) == 6
    assert runs["single/seed0"]["final_step"] == 40 and set(runs["single/seed0"]["by_step"]) == {"0", "10", "20",
                                                                                                 "30", "40"}
    g = runs["single/seed0"]["groups"]["G3/G4"]
    assert g["run"]["tasks"] == 48 and "vs_base" in g
    assert g["run"]["mean"] == pytest.approx(runs["single/seed0"]["by_step"]["40"]["G3/G4"])
    again = analysis.rescore(CONFIGS, str(records), str(tmp_path / "out2"), log=lines.append, keep=str(keep))
    assert len(calls) == 6 and again["single/seed0"]["groups"] == runs["single/seed0"]["groups"]
    assert "| single/seed0 | 40 |" in open(tmp_path / "out" / "rescore.md").read()
    final = analysis.rescore(CONFIGS, str(records), str(tmp_path / "out3"), log=lines.append, keep=str(keep),
                             final_only=True)
    assert len(calls) == 6 and set(final["single/seed0"]["by_step"]) == {"40"}
    assert final["single/seed0"]["groups"] == runs["single/seed0"]["groups"]


def test_signatures_without_the_mirror_arm_are_not_decidable_where_they_need_it(tiny, tmp_path):
    """The grid as it runs after the no-go: the mirror arm's signatures and the cure's comparison (which needs every
    RL (Single)) are not decidable; RL (Single) on P1's are computed."""
    from recipes.p4g_cross.verdicts import verdicts

    _, out, _, _ = tiny
    cut = tmp_path / "grid"
    shutil.copytree(out, cut, ignore=shutil.ignore_patterns("checkpoints"))
    shutil.rmtree(cut / "single_g1")
    s = verdicts(str(cut), CONFIGS, log=lambda s: None)["signatures"]
    assert s["family_gain"]["arms"]["single_g1"]["held"] is None
    assert s["below_base_other_family"]["arms"]["single_g1"]["held"] is None
    assert s["family_gain"]["arms"]["single_p1"]["held"] in (True, False)
    assert s["worse_family_cure"]["held"] is None
