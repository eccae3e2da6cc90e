"""Turn a config into loaded backends, model references and one partner source per role.

Roles that name the same local model share one base in memory: a trainable role gets its own LoRA
adapter (named after the role), a frozen role uses the base weights. With full fine-tuning, frozen
users of the same model get their own copy, since the trained weights would otherwise move under
them. ``backend: openai`` models become OpenAI-compatible clients.
"""
from __future__ import annotations

from typing import Any

from .config import Config
from .models.backend import LocalBackend, ModelRef
from .models.loading import open_backend
from .models.loading import backend_key, frozen_refs
from .partners.sources import build_sources


def build_models(cfg: Config) -> tuple[dict[str, LocalBackend], dict[str, Any], dict[str, Any]]:
    """Return (backends, sources per role, trainable ModelRef per role)."""
    backends: dict[str, LocalBackend] = {}
    full_trained = {rc.model for rc in cfg.roles().values()
                    if rc.trainable and not rc.self_play and cfg.models[rc.model].finetune == "full"}

    def backend(key: str, model_name: str) -> LocalBackend:
        key = backend_key(model_name, cfg.models[model_name], full_trained) if key == model_name else key
        if key not in backends:
            mc = cfg.models[model_name]
            backends[key] = open_backend(mc, model_name, seed=cfg.run.seed + len(backends))
        return backends[key]

    trainable: dict[str, ModelRef] = {}
    for role, rc in cfg.roles().items():
        if not rc.trainable:
            continue
        if rc.self_play:  # plays with the agent's weights
            trainable[role] = trainable["agent"]
            continue
        mc = cfg.models[rc.model]
        b = backend(rc.model, rc.model)
        if mc.finetune == "lora":
            b.add_lora(role, **mc.lora.model_dump())
            trainable[role] = ModelRef(id=f"{rc.model}:{role}", backend=b, adapter=role, trainable=True)
        else:
            trainable[role] = ModelRef(id=f"{rc.model}:{role}", backend=b, trainable=True)
    frozen_models = {s.model: cfg.models[s.model] for rc in cfg.roles().values() if not rc.trainable
                     for s in rc.specs()}
    frozen = frozen_refs(frozen_models, backends, cfg.run.seed,
                         backend_of=lambda name: backend(f"{name}#frozen" if name in full_trained else name, name))
    return backends, build_sources(cfg, frozen, trainable), trainable


def fallback_source(cfg: Config, backends: dict[str, LocalBackend]):
    """The partner's source after a ``switch`` alarm (``monitor.fallback``), its models on the loaded backends."""
    from .partners.sources import role_source

    fb = cfg.fallback_partner()
    frozen = frozen_refs({s.model: cfg.models[s.model] for s in fb.specs()}, backends, cfg.run.seed)
    return role_source("partner", fb, frozen, {}, cfg.run.seed)


def build_judge(cfg: Config, backends: dict[str, LocalBackend]):
    """The binding of ``env.judge`` (frozen: a model's base weights or an endpoint), or None."""
    if cfg.env.judge is None:
        return None
    from .partners.binding import spec_binding

    name = cfg.env.judge.model
    return spec_binding(cfg.env.judge, frozen_refs({name: cfg.models[name]}, backends, cfg.run.seed)[name])
