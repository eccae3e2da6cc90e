"""One extension mechanism: every kind of extension is a scope.registry.Registry, looked up alike whether an
entry was registered in code, is built in (imported on first use) or comes from an installed entry point."""
import sys
import types

import pytest

from scope.registry import Registry


def test_registered_built_in_and_installed_entries_are_looked_up_alike(monkeypatch):
    mod = types.ModuleType("scope_test_ext")
    mod.thing = lambda: "built in"
    sys.modules["scope_test_ext"] = mod
    reg: Registry = Registry("widget", builtin={"b": "scope_test_ext:thing"}, group="scope.test_widgets")

    @reg.register("a")
    def a():
        return "registered"

    class EP:
        name, value = "c", "scope_test_ext_plugin"

    plugin = types.ModuleType("scope_test_ext_plugin")
    sys.modules["scope_test_ext_plugin"] = plugin
    plugin_run = []

    def import_plugin(name):  # a bare module registers its entries when imported
        plugin_run.append(name)
        reg.register("c", lambda: "installed")
        return plugin

    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [EP] if group == "scope.test_widgets" else [])
    monkeypatch.setattr("scope.registry.importlib.import_module",
                        lambda name: import_plugin(name) if name == "scope_test_ext_plugin" else sys.modules[name])
    assert reg.names() == ["a", "b", "c"]
    assert "b" not in reg.entries  # nothing imported until asked for
    assert [reg.get(n)() for n in ("a", "b", "c")] == ["registered", "built in", "installed"]
    assert plugin_run == ["scope_test_ext_plugin"] and reg.find("nope") is None and "nope" not in reg
    with pytest.raises(KeyError, match="unknown widget 'nope'; registered: a, b, c"):
        reg.get("nope")


def test_every_kind_of_extension_is_a_registry():
    from scope.diagnostics import CLASSIFIERS
    from scope.envs.base import ENVS
    from scope.models import MODEL_BUILDERS
    from scope.partners.registry import PARTNER_SOURCES
    from scope.partners.rewards import PARTNER_REWARDS
    from scope.partners.sources import PERSONA_POOLS

    regs = [ENVS, MODEL_BUILDERS, PERSONA_POOLS, PARTNER_REWARDS, PARTNER_SOURCES, CLASSIFIERS]
    assert all(isinstance(r, Registry) for r in regs)
    assert {"p4g", "koth"} <= set(ENVS.names())
    # an experiment's entries are its recipe's, registered when its plugin is imported: none is built in
    assert set(ENVS.builtin) == {"p4g", "tau2_retail", "tau2_airline", "coop_coding", "koth"}
    assert not MODEL_BUILDERS.builtin and not PERSONA_POOLS.builtin
    assert {"single", "rotation", "persona", "pool"} <= set(PARTNER_SOURCES.names())
    assert {"env", "cooperative", "adversarial", "curriculum"} <= set(PARTNER_REWARDS.names())
    assert CLASSIFIERS.get("p4g")("[DONATE $1]") == "donate" and "builtin" not in PERSONA_POOLS.names()


def test_a_registered_partner_source_is_a_config_choice(tmp_path):
    """A source registered by name passes the config's validation and is what build_sources builds; an
    unknown one is an error that lists the registered names."""
    from scope.config import ConfigError, parse_config
    from scope.partners.binding import Binding
    from scope.partners.registry import PARTNER_SOURCES
    from scope.partners.sources import SingleSource, build_sources

    built = []

    @PARTNER_SOURCES.register("test_twice")
    def twice(ctx):
        built.append((ctx.role, ctx.spec.source, len(ctx.bindings), ctx.trained, ctx.seed))
        return SingleSource(ctx.bindings[0])

    try:
        base = {"models": {"policy": {"path": "tiny"}}, "env": {"name": "p4g"},
                "run": {"dir": str(tmp_path), "seed": 3}}
        cfg = parse_config(dict(base, partner={"model": "policy", "source": "test_twice"}))
        frozen, trained = object(), object()  # (a source only hands the model on)
        sources = build_sources(cfg, {"policy": frozen}, {"agent": trained})
        assert built == [("partner", "test_twice", 1, None, 3)]
        assert isinstance(sources["partner"].assign(None, 0, 0), Binding) and sources["partner"].binding.ref is frozen
        assert sources["agent"].binding.ref is trained
        with pytest.raises(ConfigError, match="unknown partner source 'nope'; registered: .*single"):
            parse_config(dict(base, partner={"model": "policy", "source": "nope"}))
    finally:
        PARTNER_SOURCES.entries.pop("test_twice")
