#!/usr/bin/env python3
"""Generates the golden pickles of tests/pickle (plain CPython, no torch needed).

Usage: python3 tests/pickle/golden/make_golden.py   (writes next to this script)

Each <name>.pkl is pickle.dumps(obj, protocol=2) of a representative object; the test
loads it with zckpt's VM, dumps it with zckpt's emitter and expects the same bytes.
proto/<name>.p<N>.pkl is the same object at protocol N (0, 1, 3, 4, 5): it must load to
the same tree as <name>.pkl.
torch.Size is imitated by a class of that qualified name (it pickles identically:
GLOBAL torch Size, ((dims...),) REDUCE). torch_<name>.pkl are the data.pkl records of
the real-torch fixtures in tests/fixtures/torch (copied when present).
"""
import argparse
import collections
import enum
import math
import os
import pickle
import sys
import types
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))

# A stand-in torch module, so torch.Size pickles as torch does without importing torch.
fake_torch = types.ModuleType("torch")


class Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


Size.__module__ = "torch"
Size.__qualname__ = "Size"
fake_torch.Size = Size
sys.modules.setdefault("torch", fake_torch)


class Stage(int, enum.Enum):   # like DeepSpeed's ZeroStageEnum
    disabled = 0
    optimizer_states = 1


Stage.__module__ = "__main__"


def objects():
    o = {}
    o["basic"] = {"a": 1, "b": [1, 2, 3], "c": (1, 2), "d": None, "e": True, "f": False,
                  "g": 1.5, "h": "h\u00e9llo \u2603 \U0001F600", "": "", "l1": [7], "d1": {"x": 1}}
    o["ints"] = [0, 1, 255, 256, 65535, 65536, -1, -255, -256, -(2**31), 2**31 - 1, 2**31, -(2**31) - 1,
                 2**40, -(2**40), 2**63 - 1, -(2**63), 2**63, 2**64, -(2**64), 2**100, -(2**100),
                 2**2100, -(2**2100), 127, 128, 2**32 - 1, 2**32]
    o["floats"] = [0.0, -0.0, 1.5, -2.25, math.inf, -math.inf, math.nan, 1e300, 5e-324, 0.1]
    sd = collections.OrderedDict()
    sd["w"] = 1
    sd["b"] = [2]
    sd._metadata = collections.OrderedDict([("", {"version": 1}), ("lin", {"version": 1})])
    o["ordered"] = {"state": sd, "empty": collections.OrderedDict(),
                    "one": collections.OrderedDict([("k", 1)])}
    shared = ["s"]
    k = "key"
    o["shared"] = [shared, shared, k, k, (k, shared), (k, shared)]
    o["tuples"] = ((), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), ((),), ((1,), [()]))
    o["sets"] = [set(), {1, 2, 3}, frozenset({4}), frozenset(), b"", b"ab\xff\x00", bytearray(b"xy"), b"ab\xff\x00"]
    o["sizes"] = [Size([2, 3]), Size([]), Size([1, 2, 3, 4]), {"shape": Size([5])}]
    o["memo300"] = [[f"s{i}" for i in range(300)], None]
    o["memo300"][1] = o["memo300"][0][:]   # same str objects again: LONG_BINGET
    d1000 = {f"k{i}": i for i in range(1000)}
    o["batch"] = {"d1000": d1000, "d1001": {f"k{i}": i for i in range(1001)},
                  "l1000": list(range(1000)), "l1001": list(range(1001)), "l2": [1, 2],
                  "od1000": collections.OrderedDict(d1000),
                  "od1001": collections.OrderedDict((f"k{i}", i) for i in range(1001)),
                  "od2000": collections.OrderedDict((f"k{i}", i) for i in range(2000))}
    o["objects"] = {"ns": argparse.Namespace(lr=0.1, name="adam"),
                    "dd": collections.defaultdict(int, {"a": 1, "b": 2}),
                    "dd1": collections.defaultdict(list, {"a": [1]}),
                    "stage": Stage.optimizer_states, "ctr": collections.Counter({"x": 2}),
                    "deque": collections.deque([1, 2, 3]), "cplx": complex(1, 2)}
    a = []
    t = (a, 1)
    a.append(t)
    o["recursive"] = t
    big = []
    big.append(big)
    o["self_list"] = big
    return o


def main():
    for name, obj in objects().items():
        with open(os.path.join(HERE, name + ".pkl"), "wb") as f:
            f.write(pickle.dumps(obj, protocol=2))
    # the same objects at the other protocols (the test compares the trees they load to)
    os.makedirs(os.path.join(HERE, "proto"), exist_ok=True)
    objs = objects()
    for name in ("basic", "ints", "floats", "ordered", "shared", "tuples", "sets", "sizes", "memo300"):
        for proto in (0, 1, 3, 4, 5):
            with open(os.path.join(HERE, "proto", f"{name}.p{proto}.pkl"), "wb") as f:
                f.write(pickle.dumps(objs[name], protocol=proto))
    fx = os.path.join(HERE, "..", "..", "fixtures", "torch")
    if os.path.isdir(fx):
        for fn in sorted(os.listdir(fx)):
            if not fn.endswith(".pt"):
                continue
            try:
                z = zipfile.ZipFile(os.path.join(fx, fn))
            except zipfile.BadZipFile:
                continue
            for n in z.namelist():
                if n.endswith("/data.pkl"):
                    with open(os.path.join(HERE, "torch_" + fn[:-3] + ".pkl"), "wb") as f:
                        f.write(z.read(n))


if __name__ == "__main__":
    main()
