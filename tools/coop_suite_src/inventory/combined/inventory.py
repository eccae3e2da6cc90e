class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty=1):
        if qty <= 0:
            raise ValueError("qty must be positive")
        name = name.lower()
        self.items[name] = self.items.get(name, 0) + qty

    def count(self, name):
        return self.items.get(name.lower(), 0)

    def remove(self, name, qty=1):
        name = name.lower()
        if self.items.get(name, 0) < qty:
            raise KeyError(name)
        self.items[name] -= qty
        if self.items[name] == 0:
            del self.items[name]

    def total(self):
        return sum(self.items.values())
