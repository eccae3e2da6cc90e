"""The half of the grading that runs the candidate code: a small server started in the sandbox with the
workspace first on ``sys.path``. It answers the judge (``judge.py``, on the host) one request per line on its
standard input, one reply per line on what was its standard output (the code under test prints to standard
error instead). Every value it sends is plain data (None, bool, int, float, str, bytes, and lists, tuples,
sets and dicts of them), copied into the exact built-in type whatever subclass held it; anything else stays
here and the judge holds a numbered reference to it. Its source is sent as ``python -I -c`` (nothing on disk
for the workspace to replace); it must not import anything from scope.
"""
import base64
import builtins
import importlib
import json
import os
import sys

MAX_ITEMS = 100_000
OBJECTS: dict = {}
"""The objects the judge holds references to, by number."""
EXC_NAMES = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}


def ref(obj):
    n = len(OBJECTS) + 1
    OBJECTS[n] = obj
    return n


def builtin_base(cls):
    return next((c.__name__ for c in cls.__mro__ if c.__name__ in EXC_NAMES and getattr(builtins, c.__name__)
                 is c), "Exception")


def enc(x, depth=0):
    if depth > 100:
        raise ValueError("a value nested over 100 deep")
    t = type(x)
    if x is None or t is bool:
        return x
    if isinstance(x, bool):
        return bool.__bool__(x)
    if isinstance(x, int):
        return int.__int__(x)
    if isinstance(x, float):
        v = float.__float__(x)
        return v if v == v and v not in (float("inf"), float("-inf")) else {"$": "float", "v": repr(v)}
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, (bytes, bytearray)):
        return {"$": "bytes", "v": base64.b64encode(bytes(x)).decode()}
    for kind, base in (("list", list), ("tuple", tuple), ("set", set), ("frozenset", frozenset)):
        if isinstance(x, base):
            items = list(base.__iter__(x))
            if len(items) > MAX_ITEMS:
                raise ValueError(f"a {kind} of over {MAX_ITEMS} items")
            return {"$": kind, "v": [enc(i, depth + 1) for i in items]}
    if isinstance(x, dict):
        items = list(dict.items(x))
        if len(items) > MAX_ITEMS:
            raise ValueError(f"a dict of over {MAX_ITEMS} items")
        return {"$": "dict", "v": [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in items]}
    if isinstance(x, type) and issubclass(x, BaseException):
        return {"$": "exc", "name": f"{x.__module__}.{x.__qualname__}", "base": builtin_base(x)}
    return {"$": "ref", "id": ref(x), "type": t.__name__}


def dec(x):
    if isinstance(x, list):
        return [dec(i) for i in x]
    if not isinstance(x, dict):
        return x
    kind = x["$"]
    if kind == "ref":
        return OBJECTS[x["id"]]
    if kind == "bytes":
        return base64.b64decode(x["v"])
    if kind == "float":
        return float(x["v"])
    if kind == "dict":
        return {dec(k): dec(v) for k, v in x["v"]}
    return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](dec(i) for i in x["v"])


def answer(req):
    op, obj = req["op"], OBJECTS.get(req.get("id"))
    if op == "import":
        return importlib.import_module(req["name"])
    if op == "getattr":
        return getattr(obj, req["name"])
    if op == "setattr":
        return setattr(obj, req["name"], dec(req["value"]))
    if op == "call":
        return obj(*dec(req["args"]), **{k: dec(v) for k, v in req["kwargs"].items()})
    if op == "getitem":
        return obj[dec(req["key"])]
    if op == "setitem":
        obj[dec(req["key"])] = dec(req["value"])
        return None
    if op == "contains":
        return dec(req["item"]) in obj
    if op == "iter":
        out = []
        for i in obj:
            out.append(i)
            if len(out) > MAX_ITEMS:
                raise ValueError(f"over {MAX_ITEMS} items")
        return out
    if op == "len":
        return len(obj)
    if op == "bool":
        return bool(obj)
    if op in ("str", "repr"):
        return (str if op == "str" else repr)(obj)
    raise ValueError(f"unknown request {op!r}")


def failure(e):
    """An exception of the code under test as data: its class, the built-in class it derives from, its args."""
    try:
        args = enc(list(e.args))
    except BaseException:  # noqa: B036
        args = {"$": "list", "v": []}
    try:
        text = str(e)
    except BaseException:  # noqa: B036
        text = ""
    return {"raise": type(e).__name__, "base": builtin_base(type(e)), "args": args,
            "name": f"{type(e).__module__}.{type(e).__qualname__}", "text": text}


def main():
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)  # what the code under test prints goes to standard error, never into a reply
    sys.path.insert(0, os.getcwd())
    proto_out.write(b'{"ready": true}\n')
    proto_out.flush()
    for line in proto_in:
        try:
            reply = {"ok": enc(answer(json.loads(line)))}
        except BaseException as e:  # noqa: B036 - every failure of the code under test goes back as data
            reply = failure(e)
        proto_out.write(json.dumps(reply).encode() + b"\n")
        proto_out.flush()


if __name__ == "__main__":  # so it is when run as `python -c`
    main()
