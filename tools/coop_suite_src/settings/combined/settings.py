def parse(text):
    out = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise ValueError(f"line {number}: expected key = value")
        key, value = line.split("=", 1)
        value = value.strip()
        out[key.strip()] = int(value) if value.isdigit() else value
    return out


def dump(settings):
    return "".join(f"{k} = {v}\n" for k, v in sorted(settings.items()))
