from inventory import Inventory


def test_names_are_case_insensitive():
    inv = Inventory()
    inv.add("Apple", 2)
    inv.add("APPLE")
    assert inv.count("apple") == 3 and list(inv.items) == ["apple"]
