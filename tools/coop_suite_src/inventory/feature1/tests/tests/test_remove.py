import pytest

from inventory import Inventory


def test_remove():
    inv = Inventory()
    inv.add("apple", 3)
    inv.remove("apple", 2)
    assert inv.count("apple") == 1
    inv.remove("apple")
    assert "apple" not in inv.items


def test_remove_too_many():
    inv = Inventory()
    inv.add("pear")
    with pytest.raises(KeyError):
        inv.remove("pear", 2)
