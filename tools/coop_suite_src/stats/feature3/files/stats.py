def mean(xs, weights=None):
    if weights is None:
        return sum(xs) / len(xs)
    return sum(w * x for w, x in zip(weights, xs)) / sum(weights)


def median(xs):
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2
