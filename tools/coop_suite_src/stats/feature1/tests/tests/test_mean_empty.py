import pytest

from stats import mean


def test_empty_mean():
    with pytest.raises(ValueError):
        mean([])
    assert mean([1, 2, 3]) == 2
