from textkit import truncate


def test_short_text_is_unchanged():
    assert truncate("hi", 5) == "hi"


def test_long_text_is_cut_to_width():
    assert truncate("hello world", 8) == "hello..."
    assert truncate("hello world", 6, suffix="~") == "hello~"
