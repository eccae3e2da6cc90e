"""The collapse lab end to end: the simulators behave as built, training against the collapsed simulator
shows the collapse signatures, and every cure beats it on the unseen simulators.

By default this runs the lab's quick grid (``scope grid --configs recipes/collapse_lab/configs --quick``, one
seed) into a temporary directory; with ``SCOPE_LAB_RESULTS=DIR`` it checks a grid already run there (e.g.
``scope grid --configs recipes/collapse_lab/configs --out DIR``, three seeds). The thresholds are set below,
beside the runs they come from (the recipe's README and NOTES.md); they are checked per seed, so a grid of three
seeds must show them three times. It runs in ``make test-lab`` (SCOPE_LAB_TESTS=1).
"""
import json
import os

import pytest

from scope.grid.runner import run_grid

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")

# RL (Single) against the collapsed simulator, per seed. The unseen simulators are the held-out `counter`
# and `twice` customers (no training simulator behaves like them). Measured (the recipe's NOTES.md): see the
# README's lab table; the thresholds leave room for seed noise (the standard error of one run's unseen
# mean is about 0.03).
TRAIN_REWARD_MIN = 0.85         # it learns to exploit the simulator (training reward, mean of the last 4 steps)
UNSEEN_DROP_MIN = 0.08          # its held-out reward on unseen simulators falls below its best trained evaluation
UNSEEN_MAX = 0.15               # and it ends below Base (0.19): the shortcut is what it learned
CURE_MARGIN_MIN = 0.1           # every cure ends at least this far above Single on the unseen simulators
# Not asserted: that Single's unseen reward first rises above Base. Its best trained evaluation is
# 0.03-0.04 above Base, under one standard error of the paired difference (0.037 against 2 s.e. = 0.128 in
# docs/lab/table_rerun_seed0.md: "not a peak, within the noise"), so the docs say only that it ends below
# Base. Policy entropy falls and the zero-variance fraction climbs under every paradigm here (Single's
# zero-variance ends near 0.7, the cures' at 0.3-0.6), so neither is a signature of Single.


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    out = os.environ.get("SCOPE_LAB_RESULTS")
    if out:
        with open(os.path.join(out, "results.json")) as f:
            return out, json.load(f)
    out = str(tmp_path_factory.mktemp("lab"))
    return out, run_grid(CONFIGS, out, quick=True)


def test_the_grid_writes_its_table_curves_and_cards(lab):
    out, res = lab
    for name in ("table.md", "curves.png", "results.json", "simulators.md"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    assert set(res["arms"]) >= {"base", "single", "ensemble", "persona", "vs", "cotrain", "population"}


def test_the_simulators_behave_as_built(lab):
    _, res = lab
    cards = res["simulators"]
    # the training simulator's dominant reply: yes to the basic plan it was not asked for
    assert cards["collapsed"]["accept|offer_favourite"] >= 0.8
    for sim in ("careful", "strict", "terse-counter", "verbose-counter", "verbose-twice"):
        assert cards[sim]["accept|offer_favourite"] <= 0.15, sim
        assert cards[sim]["accept|ask_then_match"] >= 0.8, sim
    for sim in ("careful", "strict", "terse-counter", "verbose-counter"):
        assert cards[sim]["names_need_when_asked"] >= 0.9, sim
    for sim in ("terse-counter", "verbose-counter"):  # neither yes nor no to an offer it was not asked for
        assert cards[sim]["goes_on_after_unasked_offer"] >= 0.9, sim
    for sim in ("careful", "strict", "collapsed"):
        assert cards[sim]["goes_on_after_unasked_offer"] <= 0.1, sim
    # twice: vague at the first question, its need at the second
    assert cards["verbose-twice"]["names_need_when_asked"] <= 0.1
    assert cards["verbose-twice"]["names_need_at_second_ask"] >= 0.9


def test_single_collapses(lab):
    _, res = lab
    for r in res["signatures"]["single"]:
        assert r["train_reward"] >= TRAIN_REWARD_MIN, r
        assert r["unseen_drop_from_peak"] >= UNSEEN_DROP_MIN, r
        assert r["end_minus_base"] < 0, r  # ends below Base (paired over the tasks; the interval is in the table)
        if r["unseen_peak_over_start"] > 0 and not r["peaks"]:
            assert "not a peak, within the noise" in open(os.path.join(lab[0], "table.md")).read()
    assert res["arms"]["single"]["unseen"] <= UNSEEN_MAX, res["arms"]["single"]


def test_every_cure_beats_single_on_unseen_simulators(lab):
    _, res = lab
    margins = res["signatures"]["cure_margin_unseen"]
    assert set(margins) == {"ensemble", "persona", "vs", "cotrain", "population"}
    for p, m in margins.items():
        assert m >= CURE_MARGIN_MIN, (p, m, res["signatures"]["cure_ranking_unseen"])
