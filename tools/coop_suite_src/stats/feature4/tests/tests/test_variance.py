from stats import variance


def test_variance():
    assert variance([1, 1, 1]) == 0
    assert variance([1, 3]) == 1
