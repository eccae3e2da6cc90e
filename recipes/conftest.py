"""What the recipes' tests share: ``../shared`` data (a test skips without it), SmolLM2's tokenizer and the tiny
random model, two torch threads, and the heavy checks that run only in their make target (`make test-lab`: the
collapse lab's quick grid, which builds its models and trains)."""
import os

import pytest
import torch

torch.set_num_threads(2)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.abspath(os.path.join(ROOT, "..", "shared"))
HEAVY = {"/recipes/collapse_lab/tests/test_quick_grid.py": ("SCOPE_LAB_TESTS", "make test-lab")}


def shared_path(*parts):
    p = os.path.join(SHARED, *parts)
    if not os.path.exists(p):
        pytest.skip(f"{p} is missing (tests that read ../shared/data skip on machines without it)")
    return p


@pytest.fixture(scope="session")
def smol_tokenizer():
    from scope.models.loading import load_tokenizer

    return load_tokenizer("smollm2-135m")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = str(item.fspath).replace(os.sep, "/")
        for part, (var, target) in HEAVY.items():
            if path.endswith(part) and os.environ.get(var) != "1":
                item.add_marker(pytest.mark.skip(reason=f"runs in `{target}` ({var}=1)"))
