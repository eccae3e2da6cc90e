from stats import mean


def test_weighted_mean():
    assert mean([1, 3], weights=[3, 1]) == 1.5
    assert mean([1, 3]) == 2
