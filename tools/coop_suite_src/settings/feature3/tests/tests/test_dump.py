from settings import dump, parse


def test_dump():
    assert dump({"b": "2", "a": "x"}) == "a = x\nb = 2\n"
    assert parse(dump({"k": "v"})) == {"k": "v"}
