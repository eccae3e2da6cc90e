"""Environments, by name: ``scope.envs.base.get_env("p4g")`` imports the module that registers it on first use
(the built-in ones, the ``scope.envs`` entry-point group, and the modules of ``run.plugins``)."""
