#!/usr/bin/env python3
"""Interop: files written by zckpt's safetensors / HF writers load in Python.

Usage: interop_safetensors.py ST_INTEROP_TOOL

1. The C tool writes one model.safetensors, a huggingface_hub-style sharded set and a
   transformers-style sharded set of the same tensors (every torch-loadable dtype, 0-dim and
   empty tensors) plus manifest.json. Each file loads with safetensors.torch.load_file (and
   transformers' load_state_dict when installed); the index is checked as
   huggingface_hub's _load_sharded_checkpoint checks it; huggingface_hub.load_torch_model
   loads the sharded sets into a module; every tensor equals the manifest byte for byte.
2. With transformers: a tiny GPT-2 saved by save_pretrained is re-sharded by the C tool
   (both index styles) and from_pretrained gives the same weights and logits.

Run through tests/interop/find_python.sh (the interop Python, with torch + safetensors).
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file

try:
    import transformers  # noqa: F401
    from transformers.modeling_utils import load_state_dict as tf_load_state_dict
except Exception:  # noqa
    transformers = None
    tf_load_state_dict = None

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
          "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "C64": torch.complex64}


def sha(t):
    return hashlib.sha256(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def check_tensor(name, t, exp):
    assert t.dtype == DTYPES[exp["dtype"]], (name, t.dtype, exp["dtype"])
    assert list(t.shape) == exp["shape"], (name, list(t.shape), exp["shape"])
    assert sha(t) == exp["sha256"], (name, "bytes differ")


def check_index(d, style):
    from pathlib import PureWindowsPath
    with open(os.path.join(d, "model.safetensors.index.json"), encoding="utf-8") as f:
        text = f.read()
    index = json.loads(text)
    assert isinstance(index, dict) and isinstance(index.get("weight_map"), dict)
    for shard in set(index["weight_map"].values()):
        p = PureWindowsPath(shard)
        assert not p.drive and not p.root and ".." not in p.parts and shard.endswith(".safetensors"), shard
    if style == "sorted":  # what transformers / DeepSpeed write
        assert text == json.dumps(index, indent=2, sort_keys=True) + "\n"
    else:  # what huggingface_hub writes
        assert text == json.dumps(index, indent=2)
    return index


def load_with_hub(d, manifest):
    """huggingface_hub.load_torch_model into a module whose buffers carry the names."""
    from huggingface_hub import load_torch_model

    root = torch.nn.Module()
    for name, exp in manifest.items():
        *path, leaf = name.split(".")
        mod = root
        for p in path:
            if not hasattr(mod, p):
                mod.add_module(p, torch.nn.Module())
            mod = getattr(mod, p)
        mod.register_buffer(leaf, torch.zeros(exp["shape"], dtype=DTYPES[exp["dtype"]]))
    load_torch_model(root, d, strict=True)
    sd = root.state_dict()
    for name, exp in manifest.items():
        check_tensor(name, sd[name], exp)


def check_written(tool, tmp):
    out = os.path.join(tmp, "written")
    subprocess.run([tool, "write", out], check=True)
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)

    single = os.path.join(out, "single", "model.safetensors")
    assert not os.path.exists(os.path.join(out, "single", "model.safetensors.index.json"))
    sd = load_file(single)
    assert set(sd) == set(manifest)
    for name, t in sd.items():
        check_tensor(name, t, manifest[name])
    with safe_open(single, framework="pt") as f:
        assert f.metadata() == {"format": "pt", "producer": "zckpt interop"}, f.metadata()
    if tf_load_state_dict:
        sd = tf_load_state_dict(single)
        for name, t in sd.items():
            check_tensor(name, t, manifest[name])
    load_with_hub(os.path.join(out, "single"), manifest)

    for style in ("hub", "sorted"):
        d = os.path.join(out, style)
        index = check_index(d, style)
        wm = index["weight_map"]
        assert set(wm) == set(manifest)
        total = 0
        seen = set()
        for shard in sorted(set(wm.values())):
            path = os.path.join(d, shard)
            sd = load_file(path)
            with safe_open(path, framework="pt") as f:
                assert f.metadata() == {"format": "pt"}, f.metadata()
            if tf_load_state_dict:
                tf_load_state_dict(path)
            for name, t in sd.items():
                assert wm[name] == shard and name not in seen
                seen.add(name)
                check_tensor(name, t, manifest[name])
                total += t.numel() * t.element_size()
        assert seen == set(manifest)
        assert index["metadata"]["total_size"] == total
        assert index["metadata"]["producer"] == "zckpt interop"
        load_with_hub(d, manifest)
    print(f"written files: OK ({len(manifest)} tensors, {len(set(wm.values()))} shards)")


def check_gpt2(tool, tmp):
    if transformers is None:
        print("transformers not installed: GPT-2 round trip skipped")
        return
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(3)
    cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=8, n_layer=2, n_head=2, n_inner=16,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).eval()
    src = os.path.join(tmp, "gpt2_src")
    model.save_pretrained(src)
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.no_grad():
        want = model(ids).logits
    for style, size in (("sorted", "3KB"), ("hub", "1KB")):
        dst = os.path.join(tmp, "gpt2_" + style)
        subprocess.run([tool, "copy", src, dst, size, style], check=True)
        assert os.path.exists(os.path.join(dst, "model.safetensors.index.json"))
        check_index(dst, style)
        m2 = GPT2LMHeadModel.from_pretrained(dst).eval()
        sd1, sd2 = model.state_dict(), m2.state_dict()
        assert set(sd1) == set(sd2)
        for k in sd1:
            assert torch.equal(sd1[k], sd2[k]), k
        with torch.no_grad():
            assert torch.equal(m2(ids).logits, want)
    print("GPT-2 re-sharded by zckpt: from_pretrained OK")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    tool = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="zck-st-interop-") as tmp:
        check_written(tool, tmp)
        check_gpt2(tool, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
