def parse(text):
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        out[key.strip()] = int(value) if value.isdigit() else value
    return out
