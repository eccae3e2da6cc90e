"""The experiments made with scope, one package each (``recipes/<name>/``): their configs, the code that only
they need (an environment, model builders, analysis hooks), their tests, notes and records. scope never imports
them; a config names one in ``run.plugins`` and a ``grid.yaml`` names its hooks."""
