import os
import sys

import pytest
import torch

torch.set_num_threads(2)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.abspath(os.path.join(ROOT, "..", "shared"))


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The real SmolLM2 tokenizer (from the embedded package; cached on disk after the first load)."""
    from scope.models.local import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture()
def tiny(smol_tokenizer):
    """A tiny randomly initialised Llama with SmolLM2's vocabulary and chat template."""
    from scope.models.local import tiny_backend

    return tiny_backend(smol_tokenizer, seed=0)


def shared_path(*parts):
    p = os.path.join(SHARED, *parts)
    if not os.path.exists(p):
        pytest.skip(f"{p} is missing (tests that read ../shared/data skip on machines without it)")
    return p


def pytest_collection_modifyitems(config, items):
    """The lab's end-to-end tests (tests/lab/) build the lab's models and train for minutes: they run in
    `make test-lab`, which sets SCOPE_LAB_TESTS=1; `make test` skips them."""
    if os.environ.get("SCOPE_LAB_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="the lab's end-to-end tests run in `make test-lab` (SCOPE_LAB_TESTS=1)")
    for item in items:
        if "/tests/lab/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)
