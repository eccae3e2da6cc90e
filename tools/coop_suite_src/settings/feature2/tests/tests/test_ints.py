from settings import parse


def test_digits_become_ints():
    assert parse("port = 8080\nhost = example") == {"port": 8080, "host": "example"}
