import pytest

from settings import parse


def test_a_line_without_equals_is_an_error():
    with pytest.raises(ValueError, match="line 2"):
        parse("a = 1\nbroken\n")
