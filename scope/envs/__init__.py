"""Environments register themselves by name; importing this package registers the built-in ones."""
from .base import ENVS, Env, get_env, register_env
from . import p4g  # noqa: F401  (registers "p4g")
from . import tau2  # noqa: F401  (registers "tau2_retail", "tau2_airline")
from . import lab  # noqa: F401  (registers "lab" and its model builder)
from .coop import env as _coop  # noqa: F401  (registers "coop_coding")

__all__ = ["ENVS", "Env", "get_env", "register_env"]
