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

--format torch-safetensors writes what torch writes, byte for byte (`cmp` of every file): the folder
HuggingFaceStorageWriter.finish consolidated at save time (committed beside sharded/), and live
consolidate_safetensors_files (num_threads 1 and 2, consolidate_safetensors_files_on_every_rank with no process
group) with the one-file mapping and with a three-file mapping in another order, given to zckpt as torch's
{fqn: i} JSON and as an index's weight_map. A live single-process save with fqn_to_index_mapping (files 1 and 3 of
3; bf16, fp16, fp64, 3-D and a non-ASCII name) is consolidated by its own finish and by zckpt from the shard names
alone. Refused in one line, nothing at OUT: a .metadata DCP, a mapping leaving a tensor out or naming one the
checkpoint lacks, an int64 tensor (torch.finfo raises) and a 0-d one (torch writes zeros for it, shown here).
With the library's path (argv[1]): the Python package's zckpt.dcp.consolidate_safetensors_files writes the same
files as torch's for the one-file and the three-file mapping, and refuses an unknown tensor in its mapping.
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
from torch.distributed.checkpoint._consolidate_hf_safetensors import (consolidate_safetensors_files,
                                                                       consolidate_safetensors_files_on_every_rank)

zckpt = os.environ["ZCK_BIN"]
zckpt_py = None   # the Python package, when its library is given (argv[1])
if len(sys.argv) > 1:
    os.environ["ZCKPT_LIBRARY"] = sys.argv[1]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import importlib  # noqa: E402
    zckpt_py = importlib.import_module("zckpt")   # not `import zckpt`: that name is the binary here
    importlib.import_module("zckpt.dcp")
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


def refused(what, d, tmp, needle, extra=(), jobs=("consolidate", "verify", "inspect", "torch-safetensors")):
    out = os.path.join(tmp, "out-" + what)
    for job in (["consolidate", "-q", d, out, *extra], ["verify", d], ["inspect", d],
                ["consolidate", "-q", "--format", "torch-safetensors", *extra, d, out]):
        name = "torch-safetensors" if "torch-safetensors" in job else job[0]
        if name not in jobs or (extra and job[0] != "consolidate"):
            continue
        r = run(*job)
        lines = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith(("damaged:", "zckpt: error:"))]
        if r.returncode == 0 or len(lines) != 1 or needle not in lines[0]:
            fail(f"{what}: {job[0]} exit {r.returncode}, expected one line naming {needle}: {(r.stdout + r.stderr).strip()!r}")
    if os.path.exists(out):
        fail(f"{what}: something was left at {out}")


def same_files(what, ours, theirs, index=True):
    """ours holds every file torch wrote in theirs, byte for byte, and zckpt's manifest besides (index=False:
    torch wrote no index there)."""
    want = sorted(f for f in os.listdir(theirs) if f.endswith((".safetensors", ".index.json")))
    got = sorted(os.listdir(ours)) if os.path.isdir(ours) else []
    if not index:
        got = [f for f in got if f != "model.safetensors.index.json"]
    if got != sorted(want + ["zckpt-manifest.json"]):
        return fail(f"{what}: files {got}, torch wrote {want}")
    for f in want:
        if open(os.path.join(ours, f), "rb").read() != open(os.path.join(theirs, f), "rb").read():
            fail(f"{what}: {f} differs from torch's")


def torch_st(what, src, out, *extra):
    r = run("consolidate", "-q", "--format", "torch-safetensors", *extra, src, out)
    if r.returncode != 0:
        fail(f"{what}: zckpt consolidate --format torch-safetensors failed: {r.stderr.strip()}")
    return r.returncode == 0


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def live_save(d, sd, mapping):
    """A single-process save through HuggingFaceStorageWriter, consolidated by its own finish() into d."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter(d, fqn_to_index_mapping=mapping, save_distributed=True,
                                                         enable_consolidation=True), no_dist=True)


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
    # ---- torch's files, byte for byte
    torch_st("finish", src, os.path.join(tmp, "ts-finish")) and \
        same_files("finish (the save's own consolidation)", os.path.join(tmp, "ts-finish"), os.path.join(src, ".."))
    same_files("one file", os.path.join(tmp, "ts-finish"), tdir)
    # on_every_rank writes its index only under a process group (rank 0, after a gather)
    for name, call in (("num_threads=2", lambda o, m: consolidate_safetensors_files(src, o, m, num_threads=2)),
                       ("on_every_rank", lambda o, m: consolidate_safetensors_files_on_every_rank(src, o, m))):
        d = os.path.join(tmp, "t-" + name)
        os.makedirs(d)
        call(d, dict.fromkeys(keys, 1))
        same_files(name, os.path.join(tmp, "ts-finish"), d, index=name != "on_every_rank")
    # three files, in torchtitan's order (an HF index's, sorted), file 3 first
    names = sorted(keys)
    three = {k: 3 - (3 * i) // len(names) for i, k in enumerate(names)}
    d3 = os.path.join(tmp, "t-three")
    os.makedirs(d3)
    consolidate_safetensors_files(src, d3, three)
    m_json = os.path.join(tmp, "three.json")
    write_json(m_json, three)
    ix_json = os.path.join(tmp, "three.index.json")
    write_json(ix_json, {"metadata": {"total_size": 0},
                         "weight_map": {k: f"model-{i:05d}-of-00003.safetensors" for k, i in three.items()}})
    for name, m in (("mapping", m_json), ("index", ix_json)):
        out = os.path.join(tmp, "ts-three-" + name)
        torch_st(f"three files ({name})", src, out, "--fqn-to-index", m) and same_files(f"three files ({name})", out, d3)

    # a live save with fqn_to_index_mapping: its shard names carry the mapping
    g = torch.Generator().manual_seed(7)
    sd = {"emb.weight": torch.randn(5, 4, generator=g), "caf\u00e9.bias": torch.randn(4, generator=g).bfloat16(),
          "conv.weight": torch.randn(2, 3, 2, generator=g).half(), "head.weight": torch.randn(3, 4, generator=g).double()}
    live = os.path.join(tmp, "live")
    live_save(live, sd, {"emb.weight": 1, "caf\u00e9.bias": 1, "conv.weight": 3, "head.weight": 3})
    shards = sorted(os.listdir(os.path.join(live, "sharded")))
    if shards != ["shard-00001-model-00001-of-00003.safetensors", "shard-00001-model-00003-of-00003.safetensors"]:
        fail(f"live save: shard files {shards}")
    out = os.path.join(tmp, "ts-live")
    torch_st("live save, mapping from the shard names", os.path.join(live, "sharded"), out) and \
        same_files("live save, mapping from the shard names", out, live)
    print(f"--format torch-safetensors = torch's files byte for byte in 7 variants")
    # the Python package's consolidate_safetensors_files, shaped as torch's: the same files
    if zckpt_py:
        py_one, py_three = os.path.join(tmp, "py-one"), os.path.join(tmp, "py-three")
        zckpt_py.dcp.consolidate_safetensors_files(src, py_one)
        same_files("zckpt.dcp.consolidate_safetensors_files", py_one, tdir)
        zckpt_py.dcp.consolidate_safetensors_files(src, py_three, three, num_threads=2)
        same_files("zckpt.dcp.consolidate_safetensors_files with a mapping", py_three, d3)
        try:
            zckpt_py.dcp.consolidate_safetensors_files(src, os.path.join(tmp, "py-bad"), {"no.such.weight": 1})
            fail("zckpt.dcp.consolidate_safetensors_files: a mapping naming an unknown tensor was taken")
        except zckpt_py.Error as e:
            if "no.such.weight" not in str(e) or os.path.exists(os.path.join(tmp, "py-bad")):
                fail(f"zckpt.dcp.consolidate_safetensors_files: refusal {e!r}, or something left at OUT")
        print("zckpt.dcp.consolidate_safetensors_files = torch's files byte for byte (one file, three files)")

    # what torch's consolidation cannot write: refused
    refused("metadata dcp", os.path.join(fixtures, "dcp", "llama_tied_w2_fp32"), tmp, "safetensors storage",
            jobs=("torch-safetensors",))
    part = os.path.join(tmp, "part.json")
    write_json(part, {k: 1 for k in names[1:]})
    refused("mapping leaves one out", src, tmp, names[0], extra=("--fqn-to-index", part), jobs=("torch-safetensors",))
    write_json(part, {**{k: 1 for k in names}, "no.such.weight": 1})
    refused("mapping names an unknown", src, tmp, "no.such.weight", extra=("--fqn-to-index", part),
            jobs=("torch-safetensors",))
    d = os.path.join(tmp, "live-int64")
    try:
        live_save(d, {"w": torch.ones(2, 2), "x": torch.arange(6).reshape(2, 3)}, None)
        fail("int64: torch consolidated an int64 tensor")
    except BaseException as e:  # CheckpointException is one: torch.finfo(torch.int64) fails once the shards are written
        if "finfo" not in str(e):
            fail(f"int64: torch failed otherwise: {e}")
    refused("int64", os.path.join(d, "sharded"), tmp, "int64", jobs=("torch-safetensors",))
    d = os.path.join(tmp, "live-0d")
    live_save(d, {"w": torch.ones(2, 2), "x": torch.tensor(2.5)}, None)
    x = load_file(os.path.join(d, "model-00001-of-00001.safetensors"))["x"]
    if x.item() != 0.0:
        fail(f"0-d: torch wrote {x.item()} for 2.5 (this test expected torch's zeros)")
    refused("0-d", os.path.join(d, "sharded"), tmp, "0-d", jobs=("torch-safetensors",))

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

    refused("torch-save", src, tmp, "safetensors storage", extra=("--format", "torch-save"), jobs=("consolidate",))

print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
