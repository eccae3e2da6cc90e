"""Turn a config into loaded backends and one ModelRef per role.

Roles that name the same model share one base in memory: a trainable role gets its own LoRA adapter
(named after the role), a frozen role uses the base weights. With full fine-tuning, a frozen role
on the same model gets its own copy, since the trained weights would otherwise move under it.
"""
from __future__ import annotations

from .config import Config
from .models.local import LocalBackend, ModelRef, load_backend


def build_models(cfg: Config) -> tuple[dict[str, LocalBackend], dict[str, ModelRef]]:
    backends: dict[str, LocalBackend] = {}
    refs: dict[str, ModelRef] = {}

    def backend(key: str, model_name: str) -> LocalBackend:
        if key not in backends:
            mc = cfg.models[model_name]
            b = load_backend(mc.path, name=model_name, seed=cfg.run.seed + len(backends), dtype=mc.dtype)
            b.kv_budget_tokens = mc.kv_budget_tokens
            backends[key] = b
        return backends[key]

    full_trained = {rc.model for rc in cfg.roles().values() if rc.trainable
                    and cfg.models[rc.model].finetune == "full"}
    for role, rc in cfg.roles().items():
        mc = cfg.models[rc.model]
        if rc.trainable and mc.finetune == "lora":
            b = backend(rc.model, rc.model)
            b.add_lora(role, r=mc.lora.r, alpha=mc.lora.alpha, dropout=mc.lora.dropout,
                       target_modules=mc.lora.target_modules)
            refs[role] = ModelRef(id=f"{rc.model}:{role}", backend=b, adapter=role, trainable=True)
        elif rc.trainable:
            refs[role] = ModelRef(id=f"{rc.model}:{role}", backend=backend(rc.model, rc.model), trainable=True)
        else:
            key = f"{rc.model}#frozen" if rc.model in full_trained else rc.model
            refs[role] = ModelRef(id=f"{rc.model}:base", backend=backend(key, rc.model), trainable=False)
    return backends, refs
