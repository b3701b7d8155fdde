#!/usr/bin/env python3
"""interop_torch.py TOOL: zckpt's .pt writer and reader against the real torch.

Run through tests/interop/find_python.sh (skips with 77 when no Python has torch).
1. zckpt writes (TOOL write), torch.load reads it with weights_only False and True and
   with mmap=True: every tensor's dtype, shape, stride, offset, bytes, Parameter flag and
   storage sharing, and the non-tensor values, match the manifest the tool printed;
   torch.save of what torch loaded gives a data.pkl byte-identical to zckpt's.
2. torch writes (torch.save of every dtype, views, a Parameter, nested containers, and a
   few non-weights_only objects), TOOL dump reads it: the same checks, the other way,
   and zckpt's weights_only verdict agrees with torch's.
"""
import collections
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

import torch

TOOL = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="zck-interop-torch-")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def tensor_bytes(t):
    t = t.detach().contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def walk(obj, prefix=""):
    """(name, tensor) pairs named as zck_torch_state_dict names them."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, (str, int)) and not isinstance(k, bool):
                yield from walk(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from walk(v, f"{prefix}.{i}" if prefix else str(i))


def dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def compare(manifest, obj, label):
    got = dict(walk(obj))
    want = manifest["tensors"]
    check(sorted(got) == sorted(want), f"{label}: names {sorted(got)} != {sorted(want)}")
    for name, m in want.items():
        t = got.get(name)
        if t is None:
            continue
        check(dtype_name(t) == m["dtype"], f"{label}: {name}: dtype {t.dtype} != {m['dtype']}")
        check(list(t.shape) == m["shape"], f"{label}: {name}: shape {list(t.shape)} != {m['shape']}")
        check(list(t.stride()) == m["stride"], f"{label}: {name}: stride {t.stride()} != {m['stride']}")
        check(t.storage_offset() == m["storage_offset"], f"{label}: {name}: offset {t.storage_offset()}")
        check(hashlib.sha256(tensor_bytes(t)).hexdigest() == m["sha256"], f"{label}: {name}: bytes differ")
        check(isinstance(t, torch.nn.Parameter) == m["parameter"], f"{label}: {name}: Parameter flag")
        check(t.requires_grad == m["requires_grad"], f"{label}: {name}: requires_grad")
    # tensors zckpt says share a storage share one in torch too
    by_key = collections.defaultdict(set)
    for name, m in want.items():
        if name in got:
            by_key[m["storage_key"]].add(got[name].untyped_storage().data_ptr())
    for key, ptrs in by_key.items():
        check(len(ptrs) == 1, f"{label}: storage {key} is {len(ptrs)} storages in torch")


def run_tool(*args):
    out = subprocess.run([TOOL, *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def data_pkl(path):
    with zipfile.ZipFile(path) as z:
        name = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
        return z.read(name)


def zckpt_writes():
    for variant in ("write", "write-simple"):
        path = os.path.join(TMP, f"zck_{variant}.pt")
        manifest = run_tool(variant, path)
        check(manifest["weights_only"] is True, f"{variant}: zckpt says its own file is not weights_only")
        for kw in ({"weights_only": False}, {"weights_only": True}, {"weights_only": True, "mmap": True}):
            label = f"{variant} torch.load({kw})"
            try:
                obj = torch.load(path, **kw)
            except Exception as e:  # noqa: BLE001
                check(False, f"{label}: {type(e).__name__}: {e}")
                continue
            compare(manifest, obj, label)
            check(obj["f32_same"] is obj["float32"], f"{label}: shared tensor not shared")
            opt = obj["opt"]
            check(opt["step"] == 10 and opt["big"] == 2**40 and opt["flag"] is True and opt["none"] is None,
                  f"{label}: scalars {opt}")
            check(opt["names"] == ["a", "b\u00e9"], f"{label}: names {opt['names']}")
            check(list(opt["state"].keys()) == [0], f"{label}: int key")
            if variant == "write":
                check(opt["lr"] == 0.5 and opt["betas"] == (0.9, 0.999), f"{label}: floats")
            check(isinstance(obj, collections.OrderedDict), f"{label}: root is {type(obj)}")
        # torch.save of the same object pickles exactly as zckpt did
        obj = torch.load(path, weights_only=False)
        again = os.path.join(TMP, f"torch_{variant}.pt")
        torch.save(obj, again)
        a, b = data_pkl(path), data_pkl(again)
        if a != b:
            i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            check(False, f"{variant}: data.pkl differs from torch.save's at byte {i} ({len(a)} vs {len(b)} bytes)")
        else:
            print(f"{variant}: data.pkl byte-identical to torch.save ({len(a)} bytes)")


def torch_writes():
    g = torch.Generator().manual_seed(7)
    sd = collections.OrderedDict()
    for dt in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
               torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128):
        sd[str(dt).replace("torch.", "")] = (torch.randn(3, 5, generator=g) * 10).to(dt)
    for dt in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, dt):
            sd[dt] = torch.arange(6).to(getattr(torch, dt)).reshape(2, 3)
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    sd["t"] = base.t()
    sd["col"] = base[:, 3]
    sd["block"] = base[1:5:2, 2:8:3]
    sd["expand"] = torch.arange(4.0).expand(3, 4)
    sd["scalar"] = torch.tensor(3.25)
    sd["empty"] = torch.empty(0, 7)
    sd["param"] = torch.nn.Parameter(torch.ones(3))
    sd["frozen"] = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    sd["nested"] = {"a": [base[2], (base[3, 1:],)], 5: {"x": torch.ones(2, dtype=torch.int64)}}
    files = {"torch_plain.pt": sd,
             "torch_objects.pt": {"w": torch.ones(2), "lr": 1e-3, "s": {1, 2}, "b": b"\x00\xff",
                                  "size": torch.Size([2, 3]), "dev": torch.device("cpu")},
             "torch_module.pt": torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2)).state_dict()}
    for fn, obj in files.items():
        path = os.path.join(TMP, fn)
        torch.save(obj, path)
        manifest = run_tool("dump", path)
        loaded = torch.load(path, weights_only=False)
        compare(manifest, loaded, f"zckpt reads {fn}")
        try:
            torch.load(path, weights_only=True)
            torch_wo = True
        except Exception as e:  # noqa: BLE001
            torch_wo = f"{type(e).__name__}"
        check((manifest["weights_only"] is True) == (torch_wo is True),
              f"{fn}: weights_only: torch {torch_wo}, zckpt {manifest['weights_only']}")


def deepspeed_files():
    """Real DeepSpeed checkpoints (tests/fixtures/deepspeed): zckpt reads what torch reads."""
    try:
        import deepspeed  # noqa: F401  (its classes must import for a full torch.load)
    except Exception:  # noqa: BLE001
        print("deepspeed not importable: DeepSpeed files not compared")
        return
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "deepspeed")
    for dirpath, _, names in sorted(os.walk(root)):
        for fn in sorted(names):
            if fn.endswith(".pt"):
                path = os.path.join(dirpath, fn)
                compare(run_tool("dump", path), torch.load(path, weights_only=False, map_location="cpu"), f"zckpt reads {fn}")


def main():
    print("torch", torch.__version__)
    zckpt_writes()
    torch_writes()
    deepspeed_files()
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("interop_torch: ok")


if __name__ == "__main__":
    main()
