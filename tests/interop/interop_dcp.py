"""interop_dcp.py: zckpt on torch Distributed Checkpoints against torch itself, run live.

For every real DCP fixture under tests/fixtures/dcp/<case> (FSDP2 folders, torchtitan's
step-N, an Accelerate save_state laid out as an HF output_dir, and the HF Trainer's own FSDP
output_dir, both also consolidated from their checkpoint-2), run torch's own
torch.distributed.checkpoint.format_utils.dcp_to_torch_save now (not the committed
result) and require `zckpt consolidate` to give the same model tensors bit for bit (names,
dtypes, shapes, bytes) in every output variant: model.safetensors, HF shards + index,
pytorch_model.bin (torch.load weights_only=True), --dtype bf16 / fp16 / fp32 (torch's
own .to() of each tensor). Tied embeddings are two entries in DCP and stay two.
`zckpt verify` passes every fixture, and `verify --write-manifest` records the folder;
`zckpt inspect` lists the weights.

Damage, on a copy: a bit flipped inside a chunk (torch's dcp_to_torch_save turns it into
a wrong weight without a word; zckpt refuses), a truncated .distcp, a missing .distcp, a
hostile .metadata (a pickle calling os.system, which torch's plain pickle.load would run):
consolidate, verify and inspect each exit non-zero with one line naming the file, and
nothing is left at OUT.
"""
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

zckpt = os.environ["ZCK_BIN"]
fixtures = os.environ.get("ZCK_FIXTURES", os.path.join(os.path.dirname(__file__), "..", "fixtures"))
root = os.path.join(fixtures, "dcp")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def same_bits(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def run(*args):
    return subprocess.run([zckpt, *args], capture_output=True, text=True)


def dcp_dir(case_dir):
    """The DCP folder of a fixture (Accelerate's: checkpoint-2/pytorch_model_fsdp_0;
    torchtitan's: step-3)."""
    for sub in (os.path.join("checkpoint-2", "pytorch_model_fsdp_0"), "step-3"):
        if os.path.isdir(os.path.join(case_dir, sub)):
            return os.path.join(case_dir, sub)
    return case_dir


def torch_model(folder, tmp):
    pt = os.path.join(tmp, "torch_full.pt")
    dcp_to_torch_save(folder, pt)
    sd = torch.load(pt, weights_only=False)
    os.unlink(pt)
    if "model" not in sd:   # torchtitan's: the model's keys at the top level
        return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    return sd["model"]


def load_hf_dir(out):
    idx = os.path.join(out, "model.safetensors.index.json")
    if os.path.exists(idx):
        wm = json.load(open(idx))["weight_map"]
        sd = {}
        for f in sorted(set(wm.values())):
            part = load_file(os.path.join(out, f))
            for k in part:
                if wm.get(k) != f:
                    fail(f"{out}: {k} is in {f} but the index says {wm.get(k)}")
            sd.update(part)
        return sd
    return load_file(os.path.join(out, "model.safetensors"))


def compare(case, variant, ours, ref, cast=None):
    if set(ours) != set(ref):
        fail(f"{case} {variant}: names differ: only zckpt {sorted(set(ours) - set(ref))}, only torch {sorted(set(ref) - set(ours))}")
        return
    for k, t in ref.items():
        want = t.to(cast) if cast is not None and t.is_floating_point() else t
        if not same_bits(ours[k], want):
            fail(f"{case} {variant}: {k} differs ({ours[k].dtype} {tuple(ours[k].shape)} vs {want.dtype} {tuple(want.shape)})")


def expect_refused(case, what, args, file_part, out=None):
    r = run(*args)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    if args[0] == "verify":   # its report: a "damaged:" line naming the file, exit 3 (or an error, exit 1)
        lines = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith(("damaged:", "zckpt: error:"))]
    if r.returncode == 0:
        fail(f"{case} {what}: `zckpt {' '.join(args[:1])}` exited 0")
    elif len(lines) != 1 or file_part not in lines[0]:
        fail(f"{case} {what}: `zckpt {args[0]}` did not say it in one line naming {file_part}: {r.stderr.strip()!r}")
    if out and os.path.exists(out):
        fail(f"{case} {what}: something was left at {out}")


with tempfile.TemporaryDirectory() as tmp:
    # st_*: safetensors storage, which dcp_to_torch_save does not read (interop_dcp_safetensors.py)
    cases = sorted(c for c in os.listdir(root) if os.path.isdir(os.path.join(root, c)) and not c.startswith("st_"))
    for case in cases:
        src = os.path.join(root, case)
        ref = torch_model(dcp_dir(src), tmp)
        o = os.path.join(tmp, case)
        variants = [
            ("safetensors", [], lambda out: load_hf_dir(out), None),
            ("shards", ["--max-shard-size", "2KB"], lambda out: load_hf_dir(out), None),
            ("bin", ["--format", "pt"], lambda out: torch.load(os.path.join(out, "pytorch_model.bin"), weights_only=True), None),
            ("bf16", ["--dtype", "bf16"], lambda out: load_hf_dir(out), torch.bfloat16),
            ("fp16", ["--dtype", "fp16"], lambda out: load_hf_dir(out), torch.float16),
            ("fp32", ["--dtype", "fp32"], lambda out: load_hf_dir(out), torch.float32),
        ]
        for name, extra, load, cast in variants:
            out = f"{o}-{name}"
            r = run("consolidate", "-q", *extra, src, out)
            if r.returncode != 0:
                fail(f"{case} {name}: zckpt consolidate failed: {r.stderr.strip()}")
                continue
            if name == "shards" and not os.path.exists(os.path.join(out, "model.safetensors.index.json")):
                fail(f"{case} shards: no index with --max-shard-size 2KB")
            compare(case, name, load(out), ref, cast)
        ckpt_n = os.path.join(src, "checkpoint-2")
        if os.path.isdir(ckpt_n):   # an output_dir (above): its checkpoint-N named itself too
            out = f"{o}-checkpoint-2"
            r = run("consolidate", "-q", ckpt_n, out)
            if r.returncode != 0:
                fail(f"{case} checkpoint-2: zckpt consolidate failed: {r.stderr.strip()}")
            else:
                compare(case, "checkpoint-2", load_hf_dir(out), ref)
        r = run("verify", src)
        if r.returncode != 0:
            fail(f"{case}: zckpt verify failed: {r.stderr.strip()}")
        r = run("inspect", src)
        if r.returncode != 0 or not all(k in r.stdout for k in ref):
            fail(f"{case}: zckpt inspect failed or lists no weights: {r.stderr.strip()}")
        print(f"{case}: consolidate = dcp_to_torch_save in {len(variants)} variants ({len(ref)} tensors); verify, inspect pass")

    # verify --write-manifest records a DCP folder, and verify then checks against it
    case = "llama_untied_w3_fp32"
    d = os.path.join(tmp, "manifest")
    shutil.copytree(os.path.join(root, case), d)
    r = run("verify", "--write-manifest", d)
    if r.returncode != 0 or not any(f.startswith("zckpt") for f in os.listdir(d)):
        fail(f"verify --write-manifest: rc {r.returncode}, {r.stderr.strip()!r}, files {sorted(os.listdir(d))}")
    r = run("verify", d)
    if r.returncode != 0:
        fail(f"verify after --write-manifest: {r.stderr.strip()}")

    # ---- damage
    case = "llama_tied_w2_fp32"

    def copy(name):
        d = os.path.join(tmp, "damage-" + name)
        shutil.copytree(os.path.join(root, case), d)
        return d

    def all_refuse(d, what, file_part):
        out = os.path.join(tmp, "out-" + what)
        expect_refused(case, what, ["consolidate", "-q", d, out], file_part, out)
        expect_refused(case, what, ["verify", d], file_part)
        if what != "bitflip":   # inspect reads the structure, not the tensor bytes
            expect_refused(case, what, ["inspect", d], file_part)

    d = copy("bitflip")
    md = pickle.load(open(os.path.join(d, ".metadata"), "rb"))
    key = next(k for k in md.storage_data if k.fqn == "model.model.embed_tokens.weight")
    info = md.storage_data[key]
    data = bytearray(open(os.path.join(d, info.relative_path), "rb").read())
    # the tensor bytes of the item: the last 64-aligned region before the item's end records
    item = bytes(data[info.offset:info.offset + info.length])
    t = torch.load(__import__("io").BytesIO(item))
    raw = t.contiguous().view(torch.uint8).numpy().tobytes()
    at = info.offset + item.index(raw) + 5
    data[at] ^= 0x10
    open(os.path.join(d, info.relative_path), "wb").write(data)
    flipped = torch_model(d, tmp)["model.embed_tokens.weight"]
    intact = torch_model(os.path.join(root, case), tmp)["model.embed_tokens.weight"]
    if torch.equal(flipped, intact):
        fail("bitflip: the flipped byte did not change torch's output (test is wrong)")
    else:
        print("bitflip: torch's dcp_to_torch_save returns the changed weight without an error")
    all_refuse(d, "bitflip", info.relative_path)

    d = copy("truncated")
    p = os.path.join(d, "__1_0.distcp")
    os.truncate(p, os.path.getsize(p) - 100)
    all_refuse(d, "truncated", "__1_0.distcp")

    d = copy("missing")
    os.unlink(os.path.join(d, "__1_0.distcp"))
    all_refuse(d, "missing", "__1_0.distcp")

    d = copy("hostile")
    marker = os.path.join(tmp, "pwned")

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    md = pickle.load(open(os.path.join(d, ".metadata"), "rb"))
    md.planner_data = {"x": Evil()}
    pickle.dump(md, open(os.path.join(d, ".metadata"), "wb"))
    all_refuse(d, "hostile", ".metadata")
    if os.path.exists(marker):
        fail("hostile: the pickle's os.system ran")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
