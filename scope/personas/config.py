"""The persona search's config (``configs/personas/*.yaml``): the models that play and mutate, the human
reference dialogues, the environment, and the search's own settings (generations, archive, fitness)."""
from __future__ import annotations

import os
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from ..config import ConfigError, ModelConfig, PartnerSpec, Strict, format_validation_error
from .features import FEATURES


class HumansConfig(Strict):
    data_dir: str | None = None
    """The P4G data directory (full_dialog.csv, full_info.csv); default SCOPE_P4G_DATA."""
    test_fraction: float = Field(default=0.2, gt=0, lt=1)
    split_seed: int = 0
    comparison: int = Field(default=48, ge=8)
    """Held-out human dialogues kept out of the coverage reference: the "real humans" row is drawn from them."""
    traces: str | None = None
    """Human dialogues of your own instead of P4G's (e.g. people in tau2's user seat, from ``scope study``):
    a JSONL file, one dialogue per line, ``{"user_turns": ["...", ...]}`` (the person's own turns, in order;
    ``split`` "train" / "test" optional, else every fifth dialogue is held out). Without it the human-likeness
    classifier and the coverage reference are P4G's persuadees, whose style features (length, questions,
    hedges, disclosure, punctuation) carry over to other tasks and whose topic does not."""


class SearchConfig(Strict):
    generations: int = Field(default=10, ge=1)
    children: int = Field(default=4, ge=1)
    """Generators varied and evaluated per generation."""
    seeds: int = Field(default=4, ge=1)
    """Starting generators (generation 0)."""
    population: int = Field(default=8, ge=1)
    """Personas a generator expands into."""
    dialogues_per_persona: int = Field(default=1, ge=1)
    descriptors: tuple[str, str] = ("words", "pushback")
    bins: int = Field(default=4, ge=1, le=32)
    human_weight: float = Field(default=0.5, ge=0)
    coverage_weight: float = Field(default=0.5, ge=0)
    max_reject: float = Field(default=0.5, ge=0, le=1)
    """A generator whose share of rejected personas is above this is rejected whole."""
    k: int = Field(default=5, ge=1)
    """Neighbours that set each human's ball in the coverage measure."""
    calibration_dialogues: int = Field(default=32, ge=4)
    """Dialogues of the default simulator (no persona) the human-likeness classifier is trained against."""
    genome: Literal["structured", "program", "both"] = "structured"
    """What a generator is: structured data (the safe default: nothing model-written runs), a Python program
    run in the sandbox (``program.py``), or both kinds in one archive (half of the seeds programs)."""
    program_rewrite_prob: float = Field(default=0.5, ge=0, le=1)
    """With a mutator model: how often a program child is the model's rewrite of its parent (else a
    structural change of its DATA)."""

    @model_validator(mode="after")
    def _desc(self):
        bad = [d for d in self.descriptors if d not in FEATURES]
        if bad:
            raise ValueError(f"search.descriptors: unknown features {bad}; have {FEATURES}")
        return self


class PersonaSearchConfig(Strict):
    run: dict[str, Any] = {"dir": "runs/personas", "seed": 0}
    models: dict[str, ModelConfig] = {"policy": ModelConfig()}
    agent: PartnerSpec = PartnerSpec(max_new_tokens=48)
    """The persuader the personas talk to (frozen)."""
    simulator: PartnerSpec = PartnerSpec(max_new_tokens=48)
    """The model that role-plays the personas."""
    mutator: PartnerSpec | None = PartnerSpec(max_new_tokens=64, temperature=0.9)
    """The model that rewrites generator texts; null: structural operators only."""
    rewrite_prob: float = Field(default=0.7, ge=0, le=1)
    expander: PartnerSpec | None = None
    """A model that turns each persona's assembled instructions into a short character description
    (role-play expansion through a model); null: the role-play template's text is the persona."""
    env: dict[str, Any] = {"name": "p4g", "options": {"max_turns": 3, "personas": "builtin"}}
    humans: HumansConfig = HumansConfig()
    search: SearchConfig = SearchConfig()
    max_context: int = Field(default=4096, ge=64)

    @model_validator(mode="after")
    def _check(self):
        if set(self.run) - {"dir", "seed"}:
            raise ValueError(f"run: unknown keys {sorted(set(self.run) - {'dir', 'seed'})} (have dir, seed)")
        if self.env.get("name") not in ("p4g", "tau2_retail", "tau2_airline"):
            raise ValueError("env.name: the persona search plays p4g, tau2_retail or tau2_airline")
        for spec in [self.agent, self.simulator] + [x for x in (self.mutator, self.expander) if x]:
            if spec.model not in self.models:
                raise ValueError(f"model {spec.model!r} is not defined in models")
        return self

    @property
    def run_dir(self) -> str:
        return str(self.run.get("dir", "runs/personas"))

    @property
    def seed(self) -> int:
        return int(self.run.get("seed", 0))


def load_search_config(path: str, overrides: list[str] | None = None) -> PersonaSearchConfig:
    from ..config import apply_override

    if not os.path.exists(path):
        raise ConfigError(f"persona search config {path} not found")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    for ov in overrides or []:
        apply_override(data, ov)
    try:
        return PersonaSearchConfig.model_validate(data)
    except ValidationError as e:
        msg = format_validation_error(e).replace("invalid config", "invalid persona search config")
        raise ConfigError(msg) from None


# ---- the evaluator -------------------------------------------------------------------------------------
