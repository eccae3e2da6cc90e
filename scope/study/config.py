"""The study's configuration (``scope study serve --config study.yaml``). Unknown keys are errors.

A study has task types (an environment, its split and options, a turn cap) and conditions (the
policies compared). Each condition names, for every task type, the agent that plays it:

- ``policy``: ``base`` or a checkpoint directory from ``scope train`` (as ``scope eval --policy``):
  its config's agent model, adapter, sampling, note and environment options are used as they were in
  training; ``config``/``set`` override them as in ``scope eval``;
- ``endpoint``: any OpenAI-compatible endpoint (``scope serve``, vLLM, a hosted API);
- ``scripted``: replies said in turn (a pilot or a test of the app without a model);
- ``team`` (King of the Hill only): a fixed team, ``bt``, ``flat`` or ``random``.

A King of the Hill task type (``env: koth``) has no chat: the participant watches one game played by the
condition's team (blue; an LLM controller through ``policy``/``endpoint``, or a fixed ``team``) against the
task type's ``options.opponent`` (red), then rates how human-like the blue team played.
"""
from __future__ import annotations

import os
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from ..config import ConfigError, ModelConfig, Strict, format_validation_error

ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


class AgentSpec(Strict):
    policy: str | None = None
    """``base`` or a checkpoint directory (``RUN_DIR/checkpoints/step_N``)."""
    config: str | None = None
    """The run config of ``policy`` (default: the checkpoint's own config.yaml)."""
    model: str | None = None
    """Override the agent's model path (e.g. the base model of ``policy: base``)."""
    set: list[str] = []
    """``KEY=VALUE`` overrides of that config (as ``scope eval --set``)."""
    endpoint: ModelConfig | None = None
    """``backend: openai`` with ``base_url`` and ``model_name``."""
    scripted: list[str] | None = None
    """Replies given in turn, cycling (tool calls included, in the environment's own format)."""
    team: Literal["bt", "flat", "random"] | None = None
    """King of the Hill: a fixed team instead of an LLM controller."""
    temperature: float | None = Field(default=None, ge=0)
    """The agent's sampling temperature in the study (default: its training temperature)."""
    max_new_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _one_kind(self):
        kinds = [k for k in ("policy", "endpoint", "scripted", "team") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"an agent is exactly one of policy, endpoint, scripted or team (got {kinds or 'none'})")
        if self.endpoint is not None and self.endpoint.backend != "openai":
            raise ValueError("endpoint: set backend: openai, base_url and model_name")
        if self.scripted is not None and not self.scripted:
            raise ValueError("scripted: give at least one reply")
        return self


class TaskType(Strict):
    env: Literal["tau2_retail", "tau2_airline", "p4g", "koth"]
    split: str = "test"
    options: dict[str, Any] = {}
    """Environment options (``data_dir``, ``personas``, ...); they override the checkpoint's."""
    task_ids: list[str] | None = None
    """A subset of the split's tasks (their ids, e.g. ``tau2_retail/5`` or ``p4g/<user id>``)."""
    max_turns: int | None = Field(default=None, ge=1)
    """Messages a participant may send (default: tau2 30, P4G 10)."""

    def turn_cap(self) -> int:
        if self.env == "koth":
            return 0  # no chat: the participant watches a game
        return self.max_turns or (10 if self.env == "p4g" else 30)

    @property
    def kind(self) -> str:
        return kind_of(self.env)


def kind_of(env: str) -> str:
    """The study's kind of a task type's environment: p4g, tau2 or koth (which survey, panel and outcomes)."""
    return env if env in ("p4g", "koth") else "tau2"


class AnalysisConfig(Strict):
    comparisons: list[tuple[str, str]] = []
    """Pre-registered pairs (condition A, condition B), tested per task type; default: every condition
    against the first one."""
    outcomes: list[str] | None = None
    """Pre-registered outcomes (default: tau2 reward, completion and satisfaction; P4G donation and
    persuasiveness); Holm-Bonferroni runs over every (comparison x outcome) test of a task type."""
    resamples: int = Field(default=10_000, ge=100)
    seed: int = 0


class StudySettings(Strict):
    id: str = Field(default="scope-study", pattern=ID_PATTERN)
    """The study id that recruitment links carry (``STUDY_ID``: on Prolific, its study id); a link with
    another one is refused."""
    database: str = "sqlite:///study.db"
    """Any SQLAlchemy URL (``postgresql+psycopg://...``); a relative SQLite path is taken from the
    config file's directory."""
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    secret_env: str = "SCOPE_STUDY_SECRET"
    """The variable holding the secret that signs completion codes and session tokens."""
    admin_token_env: str = "SCOPE_STUDY_ADMIN_TOKEN"
    completion_url: str = "https://app.prolific.com/submissions/complete?cc={code}"
    """Where a participant goes at the end; ``{code}`` is the completion code."""
    max_message_chars: int = Field(default=2000, ge=1, le=100_000)
    max_text_chars: int = Field(default=5000, ge=1, le=100_000)
    """Free-text survey answers."""
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    max_live_sessions: int = Field(default=200, ge=1)
    """Sessions whose environment (a tau2 database, say) this process keeps in memory; the least recently
    used idle ones beyond this are rebuilt from their stored turns when their participant comes back."""
    max_in_flight: int = Field(default=128, ge=1)
    """Participants' messages being answered at once, across sessions (each session has at most one: a second
    while its first is answered gets 409); one more gets 429 "busy, try again", and nothing of it is stored."""


class StudyConfig(Strict):
    study: StudySettings = StudySettings()
    tasks: dict[str, TaskType]
    conditions: dict[str, dict[str, AgentSpec]]
    """condition name -> task type name -> the agent."""
    analysis: AnalysisConfig = AnalysisConfig()
    base_dir: str = ""
    """Set by the loader: the config file's directory."""

    @model_validator(mode="after")
    def _cells(self):
        import re

        if not self.tasks:
            raise ValueError("tasks: define at least one task type")
        if not self.conditions:
            raise ValueError("conditions: define at least one condition")
        for name in list(self.tasks) + list(self.conditions):
            if not re.fullmatch(ID_PATTERN, name):
                raise ValueError(f"name {name!r}: use letters, digits, '_', '.', '-' (at most 64)")
        for c, per in self.conditions.items():
            missing = [t for t in self.tasks if t not in per]
            extra = [t for t in per if t not in self.tasks]
            if missing or extra:
                raise ValueError(f"condition {c!r}: needs an agent for every task type {sorted(self.tasks)}"
                                 + (f"; missing {missing}" if missing else "")
                                 + (f"; unknown {extra}" if extra else ""))
        for c, per in self.conditions.items():
            for t, spec in per.items():
                if spec.team is not None and self.tasks[t].env != "koth":
                    raise ValueError(f"condition {c!r}, task type {t!r}: team is for King of the Hill (env: koth)")
        for a, b in self.analysis.comparisons:
            for x in (a, b):
                if x not in self.conditions:
                    raise ValueError(f"analysis.comparisons: unknown condition {x!r}")
        return self

    def comparisons(self) -> list[tuple[str, str]]:
        if self.analysis.comparisons:
            return list(self.analysis.comparisons)
        names = list(self.conditions)
        return [(c, names[0]) for c in names[1:]]

    def cells(self) -> list[tuple[str, str]]:
        return [(c, t) for c in self.conditions for t in self.tasks]

    def database_url(self) -> str:
        url = self.study.database
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
            path = url[len("sqlite:///"):]
            url = "sqlite:///" + os.path.normpath(os.path.join(self.base_dir or os.getcwd(), path))
        return url


def parse_study(data: dict[str, Any], base_dir: str = "") -> StudyConfig:
    if not isinstance(data, dict):
        raise ConfigError("invalid study config: expected a mapping at the top level")
    try:
        cfg = StudyConfig.model_validate({**data, "base_dir": base_dir})
    except ValidationError as e:
        raise ConfigError(format_validation_error(e).replace("invalid config", "invalid study config")) from None
    return cfg


def load_study(path: str) -> StudyConfig:
    if not os.path.exists(path):
        raise ConfigError(f"study config {path} not found")
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"study config {path}: not valid YAML ({e})") from None
    return parse_study(data, os.path.dirname(os.path.abspath(path)))
