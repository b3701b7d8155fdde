"""interop_convert_unmapped.py: a sharded HF checkpoint whose shard holds tensors that the
index's weight_map leaves out. transformers' from_pretrained
takes every key of every shard the weight_map names, and huggingface_hub's load_torch_model
loads each such shard whole; `zckpt convert` must give the same state dict: every tensor of
those shards, bit for bit, with one "zckpt: warning: ..." line per unmapped tensor."""
import json
import os
import subprocess
import sys
import tempfile

import torch
from huggingface_hub import load_torch_model
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel

zckpt = os.environ["ZCK_BIN"]
failures = []


def bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


with tempfile.TemporaryDirectory() as tmp:
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    GPT2LMHeadModel(cfg).save_pretrained(os.path.join(tmp, "hf"), max_shard_size="20KB")
    index_path = os.path.join(tmp, "hf", "model.safetensors.index.json")
    index = json.load(open(index_path))
    shards = sorted(set(index["weight_map"].values()))
    if len(shards) < 3:
        sys.exit(f"FAIL the fixture has {len(shards)} shards, expected 3 or more")
    # a parameter out of the map (a shard that keeps other mapped tensors), and a second
    # one whose shard is still named by others
    dropped = ["transformer.h.1.mlp.c_fc.weight", "transformer.h.0.ln_1.bias"]
    for name in dropped:
        shard = index["weight_map"].pop(name)
        if shard not in index["weight_map"].values():
            sys.exit(f"FAIL {name} was alone in {shard}: pick another")
    with open(index_path, "w") as f:
        json.dump(index, f, indent=2)

    # what the readers load: every key of the named shards, as from_pretrained builds its
    # merged state dict (modeling_utils._load_pretrained_model)
    merged = {}
    for s in shards:
        with safe_open(os.path.join(tmp, "hf", s), framework="pt") as f:
            for k in f.keys():
                merged[k] = f.get_tensor(k)
    for name in dropped:
        if name not in merged:
            failures.append(f"{name} not in the shards: the fixture is wrong")
    model = GPT2LMHeadModel.from_pretrained(os.path.join(tmp, "hf"))
    sd = model.state_dict()
    hub_model = GPT2LMHeadModel(cfg)
    load_torch_model(hub_model, os.path.join(tmp, "hf"), strict=False)
    hub_sd = hub_model.state_dict()
    for name in dropped:  # both readers loaded the unmapped tensors (not left at random init)
        if not torch.equal(bits(sd[name]), bits(merged[name])):
            failures.append(f"transformers did not load {name}: the premise of keeping it is wrong")
        if not torch.equal(bits(hub_sd[name]), bits(merged[name])):
            failures.append(f"huggingface_hub did not load {name}: the premise of keeping it is wrong")

    out = os.path.join(tmp, "out.safetensors")
    r = subprocess.run([zckpt, "convert", "-q", os.path.join(tmp, "hf"), out], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL zckpt convert: exit {r.returncode}: {r.stderr.strip()}")
    lines = r.stderr.splitlines()
    for name in dropped:
        want = f"tensor {name} is absent from the weight_map; kept"
        if sum(1 for line in lines if line.startswith("zckpt: warning: ") and want in line) != 1:
            failures.append(f"no single warning line for {name}: {lines}")
    if len(lines) != len(dropped):
        failures.append(f"stderr should be {len(dropped)} warning lines: {lines}")
    got = load_file(out)
    if set(got) != set(merged):
        failures.append(f"tensor set: extra {sorted(set(got) - set(merged))}, missing {sorted(set(merged) - set(got))}")
    for k, t in merged.items():
        if k in got and (got[k].dtype != t.dtype or got[k].shape != t.shape or not torch.equal(bits(got[k]), bits(t))):
            failures.append(f"{k}: differs from the shard's tensor")
    # and what transformers loads from zckpt's output is the model it loaded from the shards
    os.makedirs(os.path.join(tmp, "one"))
    os.replace(out, os.path.join(tmp, "one", "model.safetensors"))
    cfg.save_pretrained(os.path.join(tmp, "one"))
    sd2 = GPT2LMHeadModel.from_pretrained(os.path.join(tmp, "one")).state_dict()
    for k, t in sd.items():
        if not torch.equal(bits(sd2[k]), bits(t)):
            failures.append(f"from_pretrained of the converted file: {k} differs")

for f in failures:
    print("FAIL", f)
print(f"{'FAILED' if failures else 'ok'}: {len(merged)} tensors, {len(dropped)} out of the weight_map")
sys.exit(1 if failures else 0)
