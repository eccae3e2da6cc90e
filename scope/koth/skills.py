"""The RL skills and the flat RL team, trained with PPO (Stable-Baselines3) on gymnasium views of the game.

A skill environment controls one unit (unit 0, team 0; every policy sees itself starting on the left) for
one game against the behaviour tree, its teammate playing the behaviour tree too; its reward is the
skill's own (``SKILL_REWARD``): capture, points while on the hill; defend, tags made and time on the hill;
intercept, closing in on the nearest enemy and tags made; retreat, getting back to its spawn; each pays
-1 for being tagged. The flat team's environment controls both units of team 0 (MultiDiscrete actions)
against the behaviour tree and is paid the team's points minus the enemy's, plus the result at the end,
with the same number of environment steps as the four skills together.

Models are saved under ``$SCOPE_CACHE/koth/<hash of these settings>/`` and reused (``scope koth train``
trains them; ``load_models`` trains whatever is missing); the package ships a trained set (``trained/``),
used while its manifest's hash is the current one.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from functools import partial
from typing import Any, Callable

import numpy as np

from .game import N_UNITS, Games, on_hill
from .policies import SKILLS, bt_skills, mine, observation, scripted_action

STEPS = {"skill": 60_000, "flat": 240_000}
PPO: dict[str, Any] = {"n_steps": 256, "batch_size": 256, "learning_rate": 3e-4, "gamma": 0.97, "n_epochs": 6,
                       "ent_coef": 0.01}
N_ENVS = 8
OBS_DIM = observation(Games(1), 0).shape[1]


def _bt_actions(g: Games) -> np.ndarray:
    a = np.zeros((g.n, N_UNITS), dtype=np.int64)
    for team in (0, 1):
        picks = bt_skills(g, team)
        for k, u in enumerate(mine(team)):
            a[:, u] = scripted_action(g, u, picks[:, k])
    return a


def SKILL_REWARD(skill: str, g: Games, before: dict[str, Any]) -> float:
    u = 0
    tagged = float(g.tagged[0, u] - before["tagged"])
    tags = float(g.tags[0, u] - before["tags"])
    pos = g.pos[0, u]
    if skill == "capture":
        r = 0.1 * float(on_hill(pos) and g.out[0, u] == 0)
    elif skill == "defend":
        r = 1.0 * tags + 0.05 * float(on_hill(pos) and g.out[0, u] == 0)
    elif skill == "intercept":
        enemies = g.pos[0, 2:][g.out[0, 2:] == 0]
        d = float(np.abs(enemies - pos).sum(-1).min()) if len(enemies) else before["dist"]
        r = 0.1 * (before["dist"] - d) + 1.0 * tags
    else:  # retreat
        d = float(np.abs(pos - np.array([0, 4])).sum())
        r = 0.1 * (before["home"] - d) + 0.05 * float(d == 0)
    return r - 1.0 * tagged


def make_env_classes():
    import gymnasium as gym
    from gymnasium import spaces

    class SkillEnv(gym.Env):
        """One unit executing one skill (see the module docstring)."""

        def __init__(self, skill: str, seed: int = 0):
            self.skill, self.seed_, self.k = skill, seed, 0
            self.observation_space = spaces.Box(-2.0, 2.0, (OBS_DIM,), np.float32)
            self.action_space = spaces.Discrete(5)

        def _obs(self):
            return observation(self.g, 0)[0]

        def _before(self) -> dict[str, Any]:
            pos = self.g.pos[0, 0]
            enemies = self.g.pos[0, 2:][self.g.out[0, 2:] == 0]
            return {"tagged": self.g.tagged[0, 0], "tags": self.g.tags[0, 0],
                    "dist": float(np.abs(enemies - pos).sum(-1).min()) if len(enemies) else 0.0,
                    "home": float(np.abs(pos - np.array([0, 4])).sum())}

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.k += 1
            self.g = Games(1, seed=self.seed_ * 100_003 + self.k)
            return self._obs(), {}

        def step(self, action):
            before = self._before()
            a = _bt_actions(self.g)
            a[0, 0] = int(action)
            self.g.step(a)
            r = SKILL_REWARD(self.skill, self.g, before)
            return self._obs(), r, self.g.done, False, {}

    class FlatEnv(gym.Env):
        """Both units of team 0 (see the module docstring)."""

        def __init__(self, seed: int = 0):
            self.seed_, self.k = seed, 0
            self.observation_space = spaces.Box(-2.0, 2.0, (2 * OBS_DIM,), np.float32)
            self.action_space = spaces.MultiDiscrete([5, 5])

        def _obs(self):
            return np.concatenate([observation(self.g, 0)[0], observation(self.g, 1)[0]])

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.k += 1
            self.g = Games(1, seed=self.seed_ * 100_003 + self.k)
            return self._obs(), {}

        def step(self, action):
            a = _bt_actions(self.g)
            a[0, :2] = np.asarray(action).reshape(2)
            pts = self.g.step(a)[0]
            r = 0.1 * float(pts[0] - pts[1])
            if self.g.done:
                r += 2.0 * float(self.g.result()[0]) - 1.0
            return self._obs(), r, self.g.done, False, {}

    return SkillEnv, FlatEnv


SKILLS_VERSION = 1
"""Bump when a skill's reward, an environment above, the observation or the game's rules change: the models
are cached (and shipped) under a hash of this and of the training settings, not of the source text, so
that an edit that changes nothing they learn does not retrain them."""
SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trained")
"""Models shipped with the package (``manifest.json`` names the settings hash they were trained under)."""


def settings_hash() -> str:
    from .game import HILL, RESPAWN, SIZE, TICKS

    blob = json.dumps([SKILLS_VERSION, STEPS, PPO, N_ENVS, OBS_DIM, SIZE, HILL, TICKS, RESPAWN, list(SKILLS)])
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def cache_dir() -> str:
    from ..models.loading import cache_root

    return os.path.join(cache_root(), "koth", settings_hash())


def model_dir() -> str:
    """Where the models are: the cache when it holds a full set trained under these settings (``scope koth
    train``), else the shipped set when its manifest names these settings, else the cache (to train into)."""
    names = list(SKILLS) + ["flat"]
    if all(os.path.exists(os.path.join(cache_dir(), f"{n}.zip")) for n in names):
        return cache_dir()
    try:
        with open(os.path.join(SHIPPED, "manifest.json")) as f:
            if json.load(f).get("settings_hash") == settings_hash():
                return SHIPPED
    except (OSError, ValueError):
        pass
    return cache_dir()


def train(names: list[str] | None = None, steps: dict[str, int] | None = None, out: str | None = None, seed: int = 0,
          log: Callable[[str], None] = print) -> dict[str, str]:
    """Train (or reuse) the skill models and the flat team; returns name -> model file."""
    import torch
    from stable_baselines3 import PPO as Algo
    from stable_baselines3.common.vec_env import DummyVecEnv

    torch.set_num_threads(1)
    SkillEnv, FlatEnv = make_env_classes()
    steps = {**STEPS, **(steps or {})}
    out = out or cache_dir()
    os.makedirs(out, exist_ok=True)
    paths = {}
    for name in names or list(SKILLS) + ["flat"]:
        path = os.path.join(out, f"{name}.zip")
        paths[name] = path
        if os.path.exists(path):
            continue
        t0 = time.time()
        if name == "flat":
            env = DummyVecEnv([partial(FlatEnv, seed + 1000 + i) for i in range(N_ENVS)])
            n = steps["flat"]
        else:
            env = DummyVecEnv([partial(SkillEnv, name, seed + 10 * SKILLS.index(name) + i) for i in range(N_ENVS)])
            n = steps["skill"]
        model = Algo("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **PPO)
        model.learn(total_timesteps=n)
        model.save(path + ".tmp")
        os.replace(path + ".tmp.zip" if os.path.exists(path + ".tmp.zip") else path + ".tmp", path)
        log(f"koth: trained {name} ({n} steps, {time.time() - t0:.0f}s) -> {path}")
    return paths


def load_models(names: list[str] | None = None, out: str | None = None, log: Callable[[str], None] = print,
                train_missing: bool = True) -> dict[str, Any]:
    from stable_baselines3 import PPO as Algo

    out = out or model_dir()
    names = names or list(SKILLS) + ["flat"]
    missing = [n for n in names if not os.path.exists(os.path.join(out, f"{n}.zip"))]
    if missing:
        if not train_missing:
            raise FileNotFoundError(f"koth: models {missing} are not trained in {out}: run `scope koth train`")
        train(missing, out=out, log=log)
    return {n: Algo.load(os.path.join(out, f"{n}.zip"), device="cpu") for n in names}
