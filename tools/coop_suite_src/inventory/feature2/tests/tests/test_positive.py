import pytest

from inventory import Inventory


def test_non_positive_quantity_is_refused():
    inv = Inventory()
    for q in (0, -2):
        with pytest.raises(ValueError):
            inv.add("apple", q)
    assert inv.count("apple") == 0
