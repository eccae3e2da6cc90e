from textkit import slugify


def test_length_limit():
    assert slugify("Hello big world", max_length=9) == "hello-big"
    assert slugify("Hello big world", max_length=10) == "hello-big"


def test_no_limit():
    assert slugify("Hello big world") == "hello-big-world"
