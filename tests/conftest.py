import os

import pytest
import torch

torch.set_num_threads(2)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.abspath(os.path.join(ROOT, "..", "shared"))


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The real SmolLM2 tokenizer (from the embedded package; cached on disk after the first load)."""
    from scope.models.loading import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture()
def tiny(smol_tokenizer):
    """A tiny randomly initialised Llama with SmolLM2's vocabulary and chat template."""
    from scope.models.loading import tiny_backend

    return tiny_backend(smol_tokenizer, seed=0)


def shared_path(*parts):
    p = os.path.join(SHARED, *parts)
    if not os.path.exists(p):
        pytest.skip(f"{p} is missing (tests that read ../shared/data skip on machines without it)")
    return p


HEAVY = {"/tests/lab/": ("SCOPE_LAB_TESTS", "make test-lab"), "/tests/soak/": ("SCOPE_SOAK_TESTS", "make test-soak"),
         "/tests/dist/": ("SCOPE_DIST_TESTS", "make test-dist"),
         "/tests/scale/": ("SCOPE_SCALE_TESTS", "make test-scale"),
         "/tests/browser/": ("SCOPE_BROWSER_TESTS", "make test-browser"),
         "/tests/core/": ("SCOPE_CORE_TESTS", "make test-core"),
         "/tests/test_gemma_real.py": ("SCOPE_GEMMA_TESTS", "make test-gemma")}


def pytest_collection_modifyitems(config, items):
    """Tests that take minutes run in their own targets: the lab's end to end (tests/lab/: builds the lab's
    models and trains) in `make test-lab`, the kill-and-resume soak (tests/soak/) in `make test-soak`,
    the vLLM engine and Ray workers (tests/scale/, in their own environment .venv-scale) in `make test-scale`,
    the study app in a real browser (tests/browser/: Playwright and Debian's chromium) in `make test-browser`.
    Each target sets its variable; `make test` skips them. A test marked ``long`` (over about 20 s on 2 cores)
    runs in `make test-long` (SCOPE_LONG_TESTS=1), so that `make test` stays under 12 minutes."""
    for item in items:
        if item.get_closest_marker("long") and os.environ.get("SCOPE_LONG_TESTS") != "1":
            item.add_marker(pytest.mark.skip(reason="over 20 s: runs in `make test-long` (SCOPE_LONG_TESTS=1)"))
        path = str(item.fspath).replace(os.sep, "/")
        for part, (var, target) in HEAVY.items():
            if part in path and os.environ.get(var) != "1":
                item.add_marker(pytest.mark.skip(reason=f"runs in `{target}` ({var}=1)"))
