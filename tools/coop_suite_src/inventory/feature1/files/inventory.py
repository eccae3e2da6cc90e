class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty=1):
        self.items[name] = self.items.get(name, 0) + qty

    def count(self, name):
        return self.items.get(name, 0)

    def remove(self, name, qty=1):
        if self.items.get(name, 0) < qty:
            raise KeyError(name)
        self.items[name] -= qty
        if self.items[name] == 0:
            del self.items[name]
