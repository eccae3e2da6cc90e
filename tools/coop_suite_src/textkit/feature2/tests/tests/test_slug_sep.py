from textkit import slugify


def test_separator():
    assert slugify("Hello World", sep="_") == "hello_world"


def test_default_separator():
    assert slugify("Hello, World!") == "hello-world"
