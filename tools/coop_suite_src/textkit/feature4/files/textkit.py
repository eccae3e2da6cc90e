import re


def slugify(text):
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words)


def word_count(text):
    return len([w for w in text.split() if any(c.isalnum() for c in w)])
