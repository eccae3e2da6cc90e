import re


def slugify(text, sep="-", max_length=None):
    words = re.findall(r"[a-z0-9]+", text.lower())
    slug = sep.join(words)
    if max_length is not None:
        slug = slug[:max_length].rstrip(sep)
    return slug


def word_count(text):
    return len([w for w in text.split() if any(c.isalnum() for c in w)])


def truncate(text, width, suffix="..."):
    if len(text) <= width:
        return text
    return text[: max(width - len(suffix), 0)] + suffix
