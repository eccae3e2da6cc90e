from stats import mode


def test_mode():
    assert mode([3, 1, 3, 2]) == 3
    assert mode([2, 1, 2, 1]) == 1
