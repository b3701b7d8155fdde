"""interop_dcp_safetensors.py: a torch Distributed Checkpoint with safetensors storage against torch itself.

tests/fixtures/dcp/st_tp2_dp2_fp32/sharded is what torch's HuggingFaceStorageWriter(save_distributed=True) wrote
for an FSDP2 + tensor parallel model on a dp 2 x tp 2 CPU mesh: shard-0000r-model-00001-of-00001.safetensors per
rank, each chunk's offsets in the header's DCP_SHARDING_INFO, o_proj / down_proj as 2-D blocks, no .metadata.
torch's own consolidation, consolidate_safetensors_files, is run live on it, and `zckpt consolidate` of the same
folder must give the same tensors bit for bit (names, dtypes, shapes, bytes) as a folder, one file, HF shards
and --dtype bf16 (torch's .to()); the files differ in their headers (zckpt writes save_pretrained's: sorted,
__metadata__ {"format": "pt"}). verify and inspect pass. Refused in one line naming the file, exit != 0, nothing
at OUT: a truncated shard, a shard gone (its chunks leave elements in no chunk: named by the folder), chunk offsets
edited to overlap, and --format torch-save (torch's dcp_to_torch_save reads only .metadata folders).
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files

zckpt = os.environ["ZCK_BIN"]
fixtures = os.environ.get("ZCK_FIXTURES", os.path.join(os.path.dirname(__file__), "..", "fixtures"))
src = os.path.join(fixtures, "dcp", "st_tp2_dp2_fp32", "sharded")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def run(*args):
    return subprocess.run([zckpt, *args], capture_output=True, text=True)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def load_dir(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(idx):
        return load_file(os.path.join(d, "model.safetensors"))
    sd = {}
    for f in sorted(set(json.load(open(idx))["weight_map"].values())):
        sd.update(load_file(os.path.join(d, f)))
    return sd


def refused(what, d, tmp, needle, extra=()):
    out = os.path.join(tmp, "out-" + what)
    for job in (["consolidate", "-q", d, out, *extra], ["verify", d], ["inspect", d]):
        if extra and job[0] != "consolidate":
            continue
        r = run(*job)
        lines = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith(("damaged:", "zckpt: error:"))]
        if r.returncode == 0 or len(lines) != 1 or needle not in lines[0]:
            fail(f"{what}: {job[0]} exit {r.returncode}, expected one line naming {needle}: {(r.stdout + r.stderr).strip()!r}")
    if os.path.exists(out):
        fail(f"{what}: something was left at {out}")


with tempfile.TemporaryDirectory() as tmp:
    tdir = os.path.join(tmp, "torch")
    # every tensor into one file, the mapping HuggingFaceStorageWriter.finish gives it (the state dict's keys -> 1)
    keys = json.load(open(os.path.join(src, "..", "model.safetensors.index.json")))["weight_map"]
    os.makedirs(tdir)
    consolidate_safetensors_files(src, tdir, fqn_to_index_mapping=dict.fromkeys(keys, 1))
    ref = load_file(os.path.join(tdir, "model-00001-of-00001.safetensors"))
    variants = [("folder", [], "out", load_dir, None),
                ("file", [], "one.safetensors", load_file, None),
                ("shards", ["--max-shard-size", "2KB"], "shards", load_dir, None),
                ("bf16", ["--dtype", "bf16"], "bf16", load_dir, torch.bfloat16)]
    for name, extra, out, load, cast in variants:
        out = os.path.join(tmp, out)
        r = run("consolidate", "-q", *extra, src, out)
        if r.returncode != 0:
            fail(f"{name}: zckpt consolidate failed: {r.stderr.strip()}")
            continue
        ours = load(out)
        if set(ours) != set(ref):
            fail(f"{name}: names differ: {sorted(set(ours) ^ set(ref))}")
            continue
        for k, t in ref.items():
            want = t.to(cast) if cast is not None else t
            if not same_bits(ours[k], want):
                fail(f"{name}: {k} differs from torch's consolidation")
    print(f"consolidate = consolidate_safetensors_files in {len(variants)} variants ({len(ref)} tensors)")
    for job in ("verify", "inspect"):
        r = run(job, src)
        if r.returncode != 0 or (job == "inspect" and "o_proj" not in r.stdout):
            fail(f"{job}: exit {r.returncode}: {r.stderr.strip()}")

    def copy(name):
        d = os.path.join(tmp, name)
        shutil.copytree(src, d)
        return d

    d = copy("truncated")
    p = os.path.join(d, "shard-00002-model-00001-of-00001.safetensors")
    os.truncate(p, os.path.getsize(p) - 100)
    refused("truncated", d, tmp, "shard-00002-model-00001-of-00001.safetensors")

    d = copy("missing")
    os.unlink(os.path.join(d, "shard-00004-model-00001-of-00001.safetensors"))
    refused("missing", d, tmp, "in no chunk")

    # o_proj's block at [0, 4] moved to [0, 3]: it overlaps the block at [0, 0], the element count still adds up
    d = copy("overlap")
    p = os.path.join(d, "shard-00002-model-00001-of-00001.safetensors")
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    info = json.loads(head["__metadata__"]["DCP_SHARDING_INFO"])
    key = "model.layers.0.self_attn.o_proj.weight"
    if info[key]["saved_offsets"] != [0, 4]:
        fail(f"overlap: the fixture's {key} block is at {info[key]['saved_offsets']}, not [0, 4]")
    info[key]["saved_offsets"] = [0, 3]
    head["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(info)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    open(p, "wb").write(struct.pack("<Q", len(h)) + h + b[8 + n:])
    refused("overlap", d, tmp, "overlap")

    refused("torch-save", src, tmp, "safetensors storage", extra=("--format", "torch-save"))

print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
