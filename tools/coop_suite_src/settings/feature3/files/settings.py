def parse(text):
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        key, value = line.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def dump(settings):
    return "".join(f"{k} = {v}\n" for k, v in sorted(settings.items()))
