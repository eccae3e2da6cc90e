"""The checks of a run config across its sections (``Config``'s last validator): every role's model exists and can
do what the role asks, the alarms that read a panel have one, self-play and the environment simulator are set
where they can play. Each raises a ValueError whose message names the key to fix."""
from __future__ import annotations

from typing import Any


def check_whole(cfg: Any) -> None:
    for role, rc in cfg.roles().items():
        for i, spec in enumerate(rc.specs()):
            where = f"{role}.rotation.{i}.model" if rc.source == "rotation" else f"{role}.model"
            if spec.model not in cfg.models:
                raise ValueError(f"{where}: {spec.model!r} is not one of models ({', '.join(cfg.models)})")
        if rc.trainable and cfg.models[rc.model].backend == "openai":
            raise ValueError(f"{role}: a trainable role needs a local or vllm model, {rc.model!r} is "
                             f"{cfg.models[rc.model].backend}")
        if rc.source == "pool" and cfg.models[rc.model].finetune != "lora":
            raise ValueError(f"{role}: a pool holds LoRA adapters; models.{rc.model}.finetune must be lora")
    if any(a.detector in ("exploit", "gap") for a in cfg.monitor.alarms) and not cfg.eval.panel:
        raise ValueError("monitor.alarms: the exploit and gap detectors read the panel's evaluations; set "
                         "eval.panel")
    if cfg.monitor.fallback is not None:
        fb = cfg.fallback_partner()
        if fb.trainable or cfg.partner.trainable:
            raise ValueError("monitor.fallback: a switch replaces a frozen partner by a frozen one")
        missing = [s.model for s in fb.specs() if s.model not in cfg.models]
        if missing:
            raise ValueError(f"monitor.fallback: {missing[0]!r} is not one of models ({', '.join(cfg.models)})")
    if cfg.train.steps == 0 and not cfg.eval.panel:
        raise ValueError("train.steps: 0 evaluates the policy as built on eval.panel, which is not set")
    if cfg.env.judge is not None and cfg.env.judge.model not in cfg.models:
        raise ValueError(f"env.judge.model: {cfg.env.judge.model!r} is not one of models "
                         f"({', '.join(cfg.models)})")
    a, p = cfg.agent, cfg.partner
    if a.trainable and p.trainable and not p.self_play and a.model == p.model \
            and cfg.models[a.model].finetune == "full":
        raise ValueError("agent and partner both fully fine-tune model "
                         f"{a.model!r}: give the partner its own models entry (its own weights)")
    for role, rc in (("agent", a), ("partner", p)):
        mc = cfg.models[rc.model]
        if rc.trainable and mc.finetune == "full" and mc.backend == "vllm" and mc.vllm.base_url:
            other = "agent" if role == "partner" else "partner"
            users = [s.model for s in getattr(cfg, other).specs() if not getattr(cfg, other).trainable]
            if cfg.env.judge is not None:
                users.append(cfg.env.judge.model)
            if rc.model in users:
                raise ValueError(f"models.{rc.model}: fully fine-tuned, its engine at vllm.base_url serves the "
                                 f"trained weights, so a frozen role cannot sample from it there; give the "
                                 f"frozen role its own models entry (or drop base_url: a second engine starts)")
    if cfg.agent.self_play:
        raise ValueError("agent.self_play: self-play is set on the partner (it plays with the agent's adapter)")
    if cfg.partner.self_play and (not cfg.agent.trainable or cfg.partner.model != cfg.agent.model):
        raise ValueError("partner.self_play needs a trainable agent on the same model")
    if cfg.partner.self_play and cfg.partner.temperature != cfg.agent.temperature:
        raise ValueError("partner.self_play: both roles sample from one policy; use the same temperature")
    from .envs.base import get_env

    try:
        env_cls = get_env(cfg.env.name)
    except KeyError as e:
        raise ValueError(f"env.name: {e.args[0]}") from None
    cfg.env.options = env_cls.check_options(cfg.env.options)  # names and types, before anything runs
    simulated = cfg.env.options.get("tools") == "simulated"
    if simulated and cfg.envsim is None:
        raise ValueError("env.options.tools: simulated needs an envsim role (envsim: {model: ...}): the model "
                         "that answers the agent's tool calls")
    if cfg.envsim is not None and not simulated:
        raise ValueError("envsim: an environment simulator plays only with env.options.tools: simulated "
                         "(tau2_retail, tau2_airline)")
    if cfg.envsim is not None and cfg.envsim.self_play:
        raise ValueError("envsim.self_play: the environment simulator plays the tools, not the agent")
    if cfg.rollout.max_staleness:
        for role, rc in cfg.roles().items():
            mc = cfg.models[rc.model]
            if rc.trainable and mc.backend == "vllm" and mc.finetune == "full":
                raise ValueError(f"rollout.max_staleness: {role}'s model {rc.model!r} is fully fine-tuned on a vLLM "
                                 f"engine, which holds one version of the weights at a time; train a LoRA adapter "
                                 f"or set rollout.max_staleness: 0")
