"""A grid's declaration: ``grid.yaml`` in a directory of run configs.

.. code-block:: yaml

    arms:                              # the table's rows, in order; a run is an arm at a seed
      base: {label: Base, config: agent.yaml, steps: 0}   # steps 0: the policy as built, evaluated once
      frozen: {label: Frozen partner}                     # config: frozen.yaml (the arm's name)
      rotation: {label: Rotation}
    seeds: 3                           # every arm at seeds 0..2, seed-major (unless ``runs`` says otherwise)
    runs: [base, frozen, rotation, frozen@1]   # optional: exactly these runs, in this order
    quick: {seeds: 1, set: [train.steps=20, eval.every=5]}   # what --quick means for this grid
    hooks:
      before: {cards: mypkg.analysis:cards}       # key -> fn(out, config, log) -> dict, kept as results[key]
      sections: [mypkg.analysis:margins]          # fn(results, spec) -> Section, below the table
    records: {adapters: fp16}          # optional: --records keeps each run's final LoRA adapters, half precision

Each arm's config is an ordinary ``scope train`` config (it may ``extends:`` a shared one); each run is
``scope train`` of it with ``run.seed`` and ``run.dir`` set. An experiment's own environment or model builder
arrives through its configs' ``run.plugins``. The grid itself knows no arm by name: what an
experiment reads into its runs beyond the generic table (its hypotheses, its cards) comes from its hooks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol

from pydantic import Field, ValidationError, model_validator

from ..config import ConfigError, Strict, format_validation_error
from ..configfile import read_mapping
from ..registry import load_function

SPEC = "grid.yaml"


class Arm(Strict):
    label: str | None = None
    """The arm's name in tables and figures (default: its key)."""
    config: str | None = None
    """Its run config, relative to the grid's directory (default: ``<key>.yaml``)."""
    steps: int | None = Field(default=None, ge=0)
    """Training steps in place of the config's (``0``: the policy as built, evaluated on the panel once)."""


class Quick(Strict):
    seeds: int = Field(default=1, ge=1)
    set: list[str] = []
    """Overrides of every run of a ``--quick`` grid (before the command line's own ``--set``)."""


class Hooks(Strict):
    before: dict[str, str] = {}
    """``key: module:function``, called as ``fn(out, config, log)`` before the first run; its dict is kept as
    ``results[key]`` (computed once per output directory: ``<key>.json`` there is read back)."""
    sections: list[str] = []
    """``module:function``, each called as ``fn(results, spec)`` once the runs are aggregated, returning a
    :class:`Section` written below the grid's table."""


class Records(Strict):
    adapters: Literal["none", "fp16"] = "none"
    """``fp16``: each run's record (``--records``) also keeps the LoRA adapters of its last checkpoint, in half
    precision, under ``final_adapters/`` (with ``step.txt``), for re-scoring or re-sampling the run later without
    making it again; ``none``: records carry no weights."""


class GridSpec(Strict):
    arms: dict[str, Arm]
    seeds: int = Field(default=1, ge=1)
    runs: list[str] | None = None
    """The runs and their order, ``arm`` or ``arm@seed`` (no seed: 0); unset: every arm at every seed."""
    quick: Quick = Quick()
    hooks: Hooks = Hooks()
    records: Records = Records()
    directory: str = ""
    """(Set when read:) the directory of grid.yaml, which the arms' config paths are relative to."""

    @model_validator(mode="after")
    def _runs_name_arms(self):
        if not self.arms:
            raise ValueError("arms: a grid needs at least one arm")
        for item in self.runs or []:
            name, _, seed = str(item).partition("@")
            if name not in self.arms:
                raise ValueError(f"runs: {item!r}: no such arm (arms: {', '.join(self.arms)})")
            if seed and not seed.isdigit():
                raise ValueError(f"runs: {item!r}: the seed after @ must be a number")
        return self

    def label(self, arm: str) -> str:
        return self.arms[arm].label or arm

    @property
    def labels(self) -> dict[str, str]:
        return {a: self.label(a) for a in self.arms}

    def config_path(self, arm: str) -> str:
        return os.path.join(self.directory, self.arms[arm].config or f"{arm}.yaml")

    def overrides(self, arm: str, seed: int, run_dir: str) -> list[str]:
        """What a run of ``arm`` at ``seed`` sets over its config (after the grid's and the caller's overrides)."""
        steps = self.arms[arm].steps
        return [f"run.seed={seed}", f"run.dir={run_dir}"] + ([f"train.steps={steps}"] if steps is not None else [])

    def plan(self, arms: tuple[str, ...] | None = None, seeds: int | None = None) -> list[tuple[str, int]]:
        """The runs, ``(arm, seed)`` in order: ``runs`` when set (those of ``arms`` below ``seeds``), else every
        arm (or those of ``arms``) at seeds 0..seeds-1, seed by seed."""
        unknown = [a for a in arms or () if a not in self.arms]
        if unknown:
            raise ValueError(f"unknown arms {unknown}: the grid in {self.directory or '.'} has {', '.join(self.arms)}")
        chosen = [a for a in self.arms if arms is None or a in arms]
        n = self.seeds if seeds is None else seeds
        if self.runs is not None:
            runs = [(name, int(seed or 0)) for name, _, seed in (str(x).partition("@") for x in self.runs)]
            return [(a, s) for a, s in runs if a in chosen and s < n]
        return [(a, s) for s in range(n) for a in chosen]


@dataclass
class Section:
    """What a grid's section hook returns: data kept as ``results[key]``, and the lines written below the
    grid's table (a blank line before them)."""

    key: str
    data: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


class SectionHook(Protocol):
    def __call__(self, results: dict[str, Any], spec: GridSpec) -> Section: ...


class BeforeHook(Protocol):
    def __call__(self, out: str, cfg: Any, log: Callable[[str], None]) -> dict[str, Any]: ...


def read_spec(directory: str) -> GridSpec:
    """``directory/grid.yaml``, validated; a missing or bad file is a ``ConfigError`` that names it."""
    path = os.path.join(directory, SPEC)
    data = read_mapping(path, f"not found: a grid's directory declares its arms in {SPEC}")
    try:
        spec = GridSpec.model_validate({**data, "directory": directory})
    except ValidationError as e:
        raise ConfigError(f"{path}: {format_validation_error(e)}") from None
    for arm in spec.arms:
        if not os.path.exists(spec.config_path(arm)):
            raise ConfigError(f"{path}: arm {arm!r}: its config {spec.config_path(arm)} is not there")
    return spec


def hook(path: str) -> Callable[..., Any]:
    """The function a hook path names; a path that does not import is a ``ConfigError`` that names it."""
    return load_function(path, "grid hook", ConfigError)
