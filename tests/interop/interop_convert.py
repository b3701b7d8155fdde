"""interop_convert.py: torch and safetensors read what `zckpt convert` writes, and zckpt
reads what they write, with every tensor equal bit for bit (all dtypes, views, 0-dim and
empty tensors, sharded output with its index)."""
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

zckpt = os.environ["ZCK_BIN"]
fixtures = os.environ.get("ZCK_FIXTURES", os.path.join(os.path.dirname(__file__), "..", "fixtures"))


def run(*args):
    r = subprocess.run([zckpt, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL zckpt {' '.join(args)}: {r.stderr.strip()}")


def bits(t):
    return t.contiguous().view(-1).view(torch.uint8) if t.numel() else t.reshape(-1).view(torch.uint8)


def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, torch.Tensor):
            out[name] = v
        elif isinstance(v, dict):
            out.update(flat(v, name + "."))
    return out


failures = []
checked = 0
with tempfile.TemporaryDirectory() as tmp:
    tensors = {
        "f32": torch.randn(5, 7), "bf16": torch.randn(33).to(torch.bfloat16), "f16": torch.randn(2, 3, 4).half(),
        "f64": torch.randn(3).double(), "i64": torch.arange(-5, 5), "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8), "b": torch.tensor([True, False]), "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4), "view_t": torch.randn(4, 6).t(), "big": torch.randn(300, 300),
    }
    src_pt = os.path.join(tmp, "src.pt")
    torch.save(tensors, src_pt)
    run("convert", "-q", src_pt, os.path.join(tmp, "a.safetensors"))
    run("convert", "-q", "--max-shard-size", "100KB", os.path.join(tmp, "a.safetensors"), os.path.join(tmp, "hf"))
    run("convert", "-q", os.path.join(tmp, "hf"), os.path.join(tmp, "b.pt"))
    a = load_file(os.path.join(tmp, "a.safetensors"))
    b = torch.load(os.path.join(tmp, "b.pt"), weights_only=True)
    index = json.load(open(os.path.join(tmp, "hf", "model.safetensors.index.json")))
    shards = set(index["weight_map"].values())
    if len(shards) < 2:
        failures.append("sharding at 100KB produced one shard")
    hf = {}
    for s in shards:
        hf.update(load_file(os.path.join(tmp, "hf", s)))
    for name, t in tensors.items():
        for label, got in (("safetensors", a), ("sharded", hf), ("torch", b)):
            checked += 1
            if name not in got or got[name].dtype != t.dtype or got[name].shape != t.shape or not torch.equal(bits(got[name]), bits(t)):
                failures.append(f"{label}: {name}")
    # --dtype bf16 equals torch's .to(torch.bfloat16) (round to nearest even)
    run("convert", "-q", "--dtype", "bf16", src_pt, os.path.join(tmp, "c.safetensors"))
    c = load_file(os.path.join(tmp, "c.safetensors"))
    for name, t in tensors.items():
        want = t.to(torch.bfloat16) if t.is_floating_point() else t
        checked += 1
        if c[name].dtype != want.dtype or not torch.equal(bits(c[name]), bits(want)):
            failures.append(f"bf16 cast: {name}")
    # files written by the real packages read back equal
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(tmp, "py.safetensors"), metadata={"format": "pt"})
    run("convert", "-q", os.path.join(tmp, "py.safetensors"), os.path.join(tmp, "py.pt"))
    d = torch.load(os.path.join(tmp, "py.pt"), weights_only=True)
    for name, t in tensors.items():
        checked += 1
        if not torch.equal(bits(d[name]), bits(t)):
            failures.append(f"from safetensors package: {name}")
    for fx in sorted(os.listdir(os.path.join(fixtures, "torch"))):
        if not fx.endswith(".pt") or fx == "legacy.pt":
            continue
        ref = flat(torch.load(os.path.join(fixtures, "torch", fx), weights_only=False))
        out = os.path.join(tmp, fx + ".safetensors")
        r = subprocess.run([zckpt, "convert", "-q", os.path.join(fixtures, "torch", fx), out], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{fx}: not convertible: {r.stderr.strip()}")
            continue
        got = load_file(out)
        for name, t in ref.items():
            checked += 1
            if name not in got or not torch.equal(bits(got[name]), bits(t)):
                failures.append(f"fixture {fx}: {name}")

for f in failures:
    print("FAIL", f)
print(f"{checked - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
