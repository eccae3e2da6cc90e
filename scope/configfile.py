"""Reading config files: a YAML mapping that names the file in its errors, ``extends:`` chains merged key by key,
and ``load_config``, a run config read through them with ``--set`` overrides (grids and panels read their own files
the same way)."""
from __future__ import annotations

import os
from typing import Any

import yaml

from .config import Config, ConfigError, apply_override, parse_config


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_mapping(path: str, missing: str = "not found") -> dict[str, Any]:
    """A YAML file whose top level is a mapping; a missing file (``missing`` says why it is needed), bad YAML or
    another top level is a ``ConfigError`` that names the file."""
    if not os.path.exists(path):
        raise ConfigError(f"{path} {missing}")
    with open(path) as f:
        try:
            data = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data


def read_config_data(path: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A config file as a dict. ``extends: OTHER.yaml`` (relative to this file) starts from that file's
    values; mappings merge key by key, anything else in this file replaces the other's value."""
    if not os.path.exists(path):
        raise ConfigError(f"config file {path} not found")
    data = read_mapping(path)
    parent = data.pop("extends", None)
    if parent is not None:
        ppath = os.path.normpath(os.path.join(os.path.dirname(path), str(parent)))
        if ppath in _seen:
            raise ConfigError(f"{path}: extends {parent} in a loop")
        data = _merge(read_config_data(ppath, _seen + (ppath,)), data)
    return data


def load_config(path: str, overrides: list[str] | None = None) -> Config:
    data = read_config_data(path)
    for ov in overrides or []:
        apply_override(data, ov)
    return parse_config(data)
