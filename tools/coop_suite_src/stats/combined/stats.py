def mean(xs, weights=None):
    if not xs:
        raise ValueError("mean of no values")
    if weights is None:
        return sum(xs) / len(xs)
    return sum(w * x for w, x in zip(weights, xs)) / sum(weights)


def median(xs):
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2


def mode(xs):
    counts = {}
    for x in xs:
        counts[x] = counts.get(x, 0) + 1
    best = max(counts.values())
    return min(x for x, c in counts.items() if c == best)


def variance(xs):
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)
