"""The collapse lab: a small sales dialogue in which simulator collapse is dialled in (README.md). Importing it
(``run.plugins: [recipes.collapse_lab]``) registers the ``lab`` environment, its behaviour classifier and persona
pool, and the ``lab:`` model builder (``lab:agent``, ``lab:customer``)."""
from scope.models import register_model_builder

from . import env  # noqa: F401  (registers the environment, its classifier and its persona pool)


def _build(name: str, options: dict, log=print) -> str:
    from .models import build

    return build(name, options, log=log)


register_model_builder("lab")(_build)
