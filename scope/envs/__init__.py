"""Environments, by name: ``get_env("p4g")`` imports the module that registers it on first use (see
:mod:`scope.envs.base`: the built-in ones and the ``scope.envs`` entry-point group)."""
from .base import ENVS, Env, env_names, get_env, register_env

__all__ = ["ENVS", "Env", "env_names", "get_env", "register_env"]
