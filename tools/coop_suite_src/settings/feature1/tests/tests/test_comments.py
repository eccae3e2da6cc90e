from settings import parse


def test_comments_are_skipped():
    assert parse("# a comment\na = x\n   # another\n") == {"a": "x"}
