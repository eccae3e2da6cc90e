"""The half of the grading that decides: pytest on the hidden tests, in a process that never runs a line of the
workspace's code. Started on the host as ``python -I judge.py`` (no scope import, no workspace on the path, no
plugin autoloading) in a directory holding only the hidden test files. Every module of the workspace that the
tests import is a stand-in whose attributes, calls and items are asked of the candidate process
(``judge_child.py``, in the sandbox) over two pipes; what comes back is plain data, rebuilt here in exact
built-in types, so the tests compare values of this process: an object that claims to equal anything never
crosses. An exception raised there is raised here as the built-in class it derives from (its own name
reproduced as a subclass of that), with the same arguments. Its JUnit report is written where the candidate
cannot reach.

    python -I judge.py --to-child FD --from-child FD --modules a,b --seconds S --report PATH test files...
"""
import argparse
import base64
import builtins
import importlib.abc
import importlib.machinery
import json
import os
import select
import sys
import time
import types

MAX_REPLY = 16 << 20


class ChildGone(RuntimeError):
    """The candidate process stopped answering (it exited, hung past the deadline, or broke the protocol)."""


class Channel:
    def __init__(self, to_child: int, from_child: int, deadline: float):
        self.out, self.inp, self.deadline, self.buf, self.dead = to_child, from_child, deadline, b"", ""

    def line(self) -> bytes:
        while b"\n" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.inp], [], [], left)[0]:
                raise ChildGone("no reply before the grading deadline")
            chunk = os.read(self.inp, 1 << 16)
            if not chunk:
                raise ChildGone("the code under test ended its process")
            self.buf += chunk
            if len(self.buf) > MAX_REPLY:
                raise ChildGone(f"a reply over {MAX_REPLY >> 20} MB")
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def ask(self, **req):
        if self.dead:
            raise ChildGone(self.dead)
        try:
            os.write(self.out, json.dumps(req).encode() + b"\n")
            reply = json.loads(self.line())
            if not isinstance(reply, dict):
                raise ValueError("not an object")
        except (ChildGone, OSError, ValueError) as e:
            self.dead = f"{type(e).__name__}: {e}"
            raise ChildGone(self.dead) from None
        if "raise" in reply:
            raise exception(reply)
        return decode(reply.get("ok"))


CHANNEL: "Channel | None" = None
_EXC: dict = {}


def exc_class(name: str, base: str) -> type:
    """The class that stands for the candidate's exception class ``name``: the built-in one where it is one,
    else a subclass of built-in ``base`` of the same name (one per name, so raising and catching agree)."""
    short = name.rsplit(".", 1)[-1]
    b = getattr(builtins, base, Exception)
    if name == f"builtins.{short}" and isinstance(getattr(builtins, short, None), type):
        return getattr(builtins, short)
    if name not in _EXC:
        _EXC[name] = type(short, (b if isinstance(b, type) and issubclass(b, Exception) else Exception,),
                          {"__module__": name.rsplit(".", 1)[0]})
    return _EXC[name]


def exception(reply: dict) -> BaseException:
    cls = exc_class(str(reply.get("name", "")), str(reply.get("base", "Exception")))
    if not issubclass(cls, Exception):  # SystemExit, KeyboardInterrupt there are plain failures here
        cls = exc_class("candidate." + cls.__name__, "Exception")
    args = decode(reply.get("args"))
    try:
        return cls(*args) if isinstance(args, list) else cls(str(reply.get("text", "")))
    except Exception:
        return cls(str(reply.get("text", "")))


def decode(x):
    if x is None or type(x) in (bool, int, float, str):
        return x
    if isinstance(x, list):
        raise ValueError("a bare list in a reply")
    kind = x["$"]
    if kind == "ref":
        return Remote(int(x["id"]), str(x.get("type", "object")))
    if kind == "exc":
        return exc_class(str(x["name"]), str(x["base"]))
    if kind == "bytes":
        return base64.b64decode(x["v"])
    if kind == "float":
        return float(x["v"])
    if kind == "dict":
        return {decode(k): decode(v) for k, v in x["v"]}
    return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](decode(i) for i in x["v"])


def encode(x):
    """An argument for the candidate: plain data, or a reference to one of its own objects."""
    if isinstance(x, Remote):
        return {"$": "ref", "id": object.__getattribute__(x, "_id")}
    if x is None or type(x) in (bool, int, str):
        return x
    if type(x) is float:
        return x if x == x and abs(x) != float("inf") else {"$": "float", "v": repr(x)}
    if type(x) is bytes:
        return {"$": "bytes", "v": base64.b64encode(x).decode()}
    if type(x) is dict:
        return {"$": "dict", "v": [[encode(k), encode(v)] for k, v in x.items()]}
    for kind, base in (("list", list), ("tuple", tuple), ("set", set), ("frozenset", frozenset)):
        if type(x) is base:
            return {"$": kind, "v": [encode(i) for i in x]}
    raise TypeError(f"cannot hand a {type(x).__name__} to the code under test")


def ask(**req):
    assert CHANNEL is not None
    return CHANNEL.ask(**req)


class Remote:
    """An object that lives in the candidate process. It equals only itself: its own ``__eq__`` is never asked."""

    __slots__ = ("_id", "_type")

    def __init__(self, ident: int, typ: str):
        object.__setattr__(self, "_id", ident)
        object.__setattr__(self, "_type", typ)

    def _req(self, op, **kw):
        return ask(op=op, id=object.__getattribute__(self, "_id"), **kw)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._req("getattr", name=name)

    def __setattr__(self, name, value):
        self._req("setattr", name=name, value=encode(value))

    def __call__(self, *args, **kwargs):
        return self._req("call", args=[encode(a) for a in args], kwargs={k: encode(v) for k, v in kwargs.items()})

    def __getitem__(self, key):
        return self._req("getitem", key=encode(key))

    def __setitem__(self, key, value):
        self._req("setitem", key=encode(key), value=encode(value))

    def __contains__(self, item):
        return self._req("contains", item=encode(item)) is True

    def __iter__(self):
        return iter(self._req("iter"))

    def __len__(self):
        n = self._req("len")
        if type(n) is not int:
            raise TypeError("len() of the candidate's object is not an int")
        return n

    def __bool__(self):
        return self._req("bool") is True

    def __str__(self):
        return str(self._req("str"))

    def __repr__(self):
        return f"<candidate {object.__getattribute__(self, '_type')}: {self._req('repr')}>"

    def __eq__(self, other):
        return other is self

    def __hash__(self):
        return hash(("remote", object.__getattribute__(self, "_id")))


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of the workspace's modules give stand-ins that ask the candidate process for their attributes."""

    def __init__(self, tops: set[str]):
        self.tops = tops

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.tops:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        remote = ask(op="import", name=spec.name)
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = lambda attr: remote.__getattr__(attr)  # PEP 562: asked for what the module lacks
        return mod

    def exec_module(self, module):
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--to-child", type=int, required=True)
    ap.add_argument("--from-child", type=int, required=True)
    ap.add_argument("--modules", default="")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    global CHANNEL
    CHANNEL = Channel(a.to_child, a.from_child, time.monotonic() + a.seconds)
    try:
        hello = json.loads(CHANNEL.line())
        if hello != {"ready": True}:
            raise ValueError(hello)
    except (ChildGone, ValueError) as e:
        CHANNEL.dead = f"the candidate process did not start: {e}"
    sys.meta_path.insert(0, StandIns({m for m in a.modules.split(",") if m}))
    import pytest

    return int(pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", "-c", "pytest.ini",
                            "--rootdir", os.getcwd(), f"--junitxml={a.report}", *a.files]))


if __name__ == "__main__":
    sys.exit(main())
