"""Loading a trained policy for evaluation or a study: a checkpoint directory (its run config and adapter)
or ``base``, as one Binding (used by ``scope eval``, cross-play and the study app's conditions)."""
from __future__ import annotations

import os


def load_policy(policy: str, cfg_path: str | None, model: str | None, overrides: list[str]):
    """The agent to evaluate: a checkpoint directory (its config and adapter) or 'base'. Returns (the run
    config, the loaded backends, the agent's binding)."""
    from .config import ConfigError, apply_override, parse_config
    from .configfile import load_config
    from .models.loading import adapter_dir, load_frozen_adapter
    from .models.backend import ModelRef
    from .models.loading import load_backend
    from .partners.binding import spec_binding

    if policy != "base" and cfg_path is None:  # the run's config: beside RUN_DIR/best, above checkpoints/step_N
        p = os.path.normpath(policy)
        found = [c for c in (os.path.join(p, "config.yaml"), os.path.join(os.path.dirname(p), "config.yaml"),
                             os.path.join(os.path.dirname(os.path.dirname(p)), "config.yaml")) if os.path.exists(c)]
        cfg_path = found[0] if found else None
    if cfg_path and os.path.exists(cfg_path):
        cfg = load_config(cfg_path, overrides)
    else:
        data: dict = {}
        for ov in overrides:
            apply_override(data, ov)
        cfg = parse_config(data)
    if model:
        cfg.models[cfg.agent.model].path = model
    mc = cfg.models[cfg.agent.model]
    b = load_backend(mc.path, name=cfg.agent.model, seed=cfg.run.seed, dtype=mc.dtype, device=mc.device,
                     template=mc.template)
    adapter = None
    if policy != "base":
        try:
            d = adapter_dir(policy, roles=("agent",))
        except ConfigError:
            d = None
        if d is not None:  # a LoRA checkpoint: its adapter on the run's base, as saved (rank, layers, modules)
            load_frozen_adapter(ModelRef(f"{cfg.agent.model}:base", b), d, "agent")
            adapter = "agent"
        else:  # a fully fine-tuned checkpoint: its own weights
            full = [x for x in (os.path.join(policy, "agent", "agent"), os.path.join(policy, "agent"), policy)
                    if os.path.exists(os.path.join(x, "config.json"))]
            if not full:
                raise FileNotFoundError(f"{policy}: no adapter or model weights found")
            b = load_backend(full[0], name=cfg.agent.model, seed=cfg.run.seed)
    return cfg, {cfg.agent.model: b}, spec_binding(cfg.agent, ModelRef(f"{cfg.agent.model}:{policy}", b, adapter))
