import re


def slugify(text, sep="-"):
    words = re.findall(r"[a-z0-9]+", text.lower())
    return sep.join(words)


def word_count(text):
    return len(text.split())
