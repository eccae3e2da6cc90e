from inventory import Inventory


def test_total():
    inv = Inventory()
    assert inv.total() == 0
    inv.add("a", 2)
    inv.add("b", 5)
    assert inv.total() == 7
