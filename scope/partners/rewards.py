"""Partner rewards, chosen by name in the config (``partner.reward``); more can be registered.

A reward function gets all episodes of a step and the partner's role name, and returns one reward
per episode (None leaves the episode's own reward for that role). The agent's reward is the
environment's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ..registry import Registry
from ..types import Episode

RewardFn = Callable[[Sequence[Episode], str, str], list]


@dataclass(frozen=True)
class PartnerReward:
    fn: RewardFn
    baseline: str = "group"
    """The advantage baseline the reward needs: ``group`` (z-score within a task's group) or ``step`` (over all
    episodes of the step: a reward that is constant within a group has no signal inside it)."""


PARTNER_REWARDS: Registry[PartnerReward] = Registry("partner reward", group="scope.partner_rewards")
"""``partner.reward``: the built-in rewards below, and any registered with :func:`register_reward`."""


def register_reward(name: str, baseline: str = "group") -> Callable[[RewardFn], RewardFn]:
    if baseline not in ("group", "step"):
        raise ValueError(f"baseline must be 'group' or 'step', not {baseline!r}")

    def deco(fn: RewardFn) -> RewardFn:
        PARTNER_REWARDS.register(name, PartnerReward(fn, baseline))
        return fn

    return deco


def reward_of(name: str) -> PartnerReward:
    """A registered reward, or a function by import path (``package.module:function``, as slime's
    ``--custom-rm-path``), which takes ``(episodes, role, agent)`` and returns one reward or None per episode,
    with the ``group`` baseline. An unknown name or a path that does not import is a ``KeyError`` naming it."""
    found = PARTNER_REWARDS.find(name)
    if found is not None:
        return found
    if ":" in name:
        from ..registry import load_function

        return PartnerReward(load_function(name, "reward", KeyError))
    raise KeyError(f"unknown reward {name!r}; registered: {', '.join(PARTNER_REWARDS.names())}, or "
                   f"package.module:function")


def baseline_of(reward: str, setting: str = "auto") -> str:
    """The baseline a role's advantages use: its ``baseline`` setting, or (``auto``) its reward's."""
    if setting != "auto":
        return setting
    return reward_of(reward).baseline if reward != "env" else "group"


def _agent_r(ep: Episode, agent: str) -> float | None:
    return None if ep.failed or agent not in ep.rewards else ep.rewards[agent]


@register_reward("env")
def env_reward(episodes, role, agent="agent"):
    """The environment's own reward for the partner role."""
    return [None] * len(episodes)


@register_reward("cooperative")
def cooperative(episodes, role, agent="agent"):
    return [_agent_r(e, agent) for e in episodes]


def fidelity(ep: Episode) -> float:
    """1.0 unless the environment found the partner out of character (``meta["partner_fidelity"]``: an
    environment that can tell when a simulator breaks its own scenario, e.g. a customer who turns down
    the very plan it said it needs, or ends the dialogue with a reply cut at its token limit, sets it to 0
    for that rollout)."""
    return float(ep.meta.get("partner_fidelity", 1.0))


@register_reward("adversarial")
def adversarial(episodes, role, agent="agent", bounded: bool | None = None):
    """1 - r_agent when every agent reward of the step lies in [0, 1], else -r_agent; a rollout in which
    the partner broke character (``fidelity``) gets the lowest value instead (0, or -max r_agent), so
    that the simulator learns to be hard on the agent within its scenario, not to stop playing it."""
    rs = [_agent_r(e, agent) for e in episodes]
    vals = [r for r in rs if r is not None]
    in_unit = all(0.0 <= r <= 1.0 for r in vals) if bounded is None else bounded
    worst = 0.0 if in_unit else -max(vals, default=0.0)
    return [None if r is None else ((1.0 - r if in_unit else -r) if fidelity(e) > 0 else worst)
            for e, r in zip(episodes, rs)]


def curriculum_value(s2: float, target: float = 0.25, width: float = 0.02) -> float:
    """exp(-(s2 - target)^2 / width): highest when the agent's group reward variance is at the target."""
    return math.exp(-((s2 - target) ** 2) / width)


@register_reward("curriculum", baseline="step")
def curriculum(episodes, role, agent="agent"):
    """Every partner rollout of a group gets exp(-(s2 - 0.25)^2 / 0.02), s2 = variance of the agent's
    rewards within the group (population variance; failed rollouts left out). The value is the same
    for the whole group, so its advantages are taken across the groups of the step (baseline step)."""
    groups: dict[str, list[float]] = {}
    for e in episodes:
        r = _agent_r(e, agent)
        if r is not None:
            groups.setdefault(e.group_id, []).append(r)
    out = []
    for e in episodes:
        g = groups.get(e.group_id)
        if _agent_r(e, agent) is None or not g:
            out.append(None)
            continue
        m = sum(g) / len(g)
        out.append(curriculum_value(sum((x - m) ** 2 for x in g) / len(g)))
    return out


def apply_partner_reward(name: str, episodes: Sequence[Episode], role: str, agent: str = "agent") -> int:
    """Set ``role``'s reward of each episode by the reward ``name`` (None keeps the environment's). A reward
    function that raises fails every episode of the step, one that returns no number for an episode fails
    that episode (each with the reason); the step goes on. Returns the number of episodes it failed."""
    fn = reward_of(name).fn
    live = [e for e in episodes if not e.failed]
    try:
        values = list(fn(episodes, role, agent))
        if len(values) != len(episodes):
            raise ValueError(f"returned {len(values)} rewards for {len(episodes)} episodes")
    except Exception as err:  # noqa: BLE001 - a user's function: its episodes fail, the step goes on
        for ep in live:
            ep.status, ep.error = "failed", f"reward {name!r} for {role!r}: {type(err).__name__}: {err}"
        return len(live)
    failed = 0
    for e, r in zip(episodes, values):
        if r is None or e.failed:
            continue
        try:
            v = float(r)
            if not math.isfinite(v):
                raise ValueError("not finite")
        except (TypeError, ValueError):
            e.status, e.error = "failed", f"reward {name!r} for {role!r}: {r!r} is not a finite number"
            failed += 1
            continue
        e.rewards[role] = v
    return failed
