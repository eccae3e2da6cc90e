import re


def slugify(text):
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words)


def word_count(text):
    return len(text.split())


def truncate(text, width, suffix="..."):
    if len(text) <= width:
        return text
    return text[: max(width - len(suffix), 0)] + suffix
