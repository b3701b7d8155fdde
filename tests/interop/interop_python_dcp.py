"""interop_python_dcp.py LIBZCKPT: zckpt.dcp_to_torch_save against torch's own, run live.

For every real DCP fixture under tests/fixtures/dcp/<case> (FSDP2 folders, torchtitan's step-N,
Accelerate's and the HF Trainer's checkpoint-2/pytorch_model_fsdp_0), torch's
torch.distributed.checkpoint.format_utils.dcp_to_torch_save(dir, path) runs now, and
zckpt.dcp_to_torch_save(dir, path), same arguments, must write a file that torch.load
(weights_only=True) reads into the model state dict torch's file holds (its ["model"], or its
top-level tensors for torchtitan): the same names, dtypes, shapes and bits. The zip's archive
folder is the file's stem, as torch.save names it, for a .pt and for another suffix (.pth).
Also: the HF Trainer's checkpoint-N and output_dir as dcp_checkpoint_dir; an existing file is
replaced (as torch.save does), or refused with overwrite=False; a DeepSpeed checkpoint, a bit
flipped inside a chunk (torch's returns the wrong weight silently) and a missing .distcp are
refused with zckpt.Error naming the file, and nothing is left at the path (an earlier file
there stays as it was); zckpt.consolidate itself raises status "damaged" for the flipped bit.
"""
import os
import pickle
import shutil
import sys
import tempfile
import zipfile

os.environ["ZCKPT_LIBRARY"] = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "python"))

import torch  # noqa: E402
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as torch_dcp_to_torch_save  # noqa: E402

import zckpt  # noqa: E402
from zckpt.dcp import dcp_to_torch_save  # noqa: E402

ROOT = os.path.join(SRC, "tests", "fixtures", "dcp")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def same_bits(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def dcp_dir(case_dir):
    for sub in (os.path.join("checkpoint-2", "pytorch_model_fsdp_0"), "step-3"):
        if os.path.isdir(os.path.join(case_dir, sub)):
            return os.path.join(case_dir, sub)
    return case_dir


def torch_model(folder, tmp):
    pt = os.path.join(tmp, "torch_full.pt")
    torch_dcp_to_torch_save(folder, pt)
    sd = torch.load(pt, weights_only=False)
    os.unlink(pt)
    if "model" not in sd:   # torchtitan's: the model's keys at the top level
        return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    return sd["model"]


def compare(what, path, ref):
    ours = torch.load(path, weights_only=True)
    if list(ours) != list(ref) and set(ours) != set(ref):
        fail(f"{what}: names differ: only zckpt {sorted(set(ours) - set(ref))}, only torch {sorted(set(ref) - set(ours))}")
        return
    for k, t in ref.items():
        if not same_bits(ours[k], t):
            fail(f"{what}: {k} differs ({ours[k].dtype} {tuple(ours[k].shape)} vs {t.dtype} {tuple(t.shape)})")


def archive_folder(path):
    with zipfile.ZipFile(path) as z:
        return {n.split("/", 1)[0] for n in z.namelist()}


def expect_refused(what, folder, path, file_part, before=None):
    try:
        dcp_to_torch_save(folder, path)
        fail(f"{what}: accepted")
    except zckpt.Error as e:
        if file_part not in str(e) or "\n" in str(e):
            fail(f"{what}: the error is not one line naming {file_part}: {e}")
    left = sorted(x for x in os.listdir(os.path.dirname(path)) if os.path.basename(path) in x)
    if before is None and left:
        fail(f"{what}: left {left}")
    if before is not None and open(path, "rb").read() != before:
        fail(f"{what}: the earlier file at the path was changed")


with tempfile.TemporaryDirectory() as tmp:
    for case in sorted(c for c in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, c))):
        folder = dcp_dir(os.path.join(ROOT, case))
        ref = torch_model(folder, tmp)
        for name in ("model.pt", "weights.pth"):
            out = os.path.join(tmp, f"{case}-{name}")
            got = dcp_to_torch_save(folder, out)
            if got != out:
                fail(f"{case}: returned {got}, not {out}")
            compare(f"{case} {name}", out, ref)
            stem = os.path.basename(out).rsplit(".", 1)[0]
            if archive_folder(out) != {stem}:
                fail(f"{case} {name}: zip archive folder {archive_folder(out)}, torch.save names it {stem!r}")
        print(f"{case}: dcp_to_torch_save = torch's model state dict ({len(ref)} tensors), .pt and .pth")

    # an HF Trainer output_dir and its checkpoint-N are taken as the folder they hold
    trainer = os.path.join(ROOT, "hf_trainer_tied_w2_fp32")
    ref = torch_model(dcp_dir(trainer), tmp)
    for folder in (trainer, os.path.join(trainer, "checkpoint-2")):
        out = os.path.join(tmp, "trainer.pt")
        dcp_to_torch_save(folder, out)
        compare(f"HF Trainer {os.path.relpath(folder, ROOT)}", out, ref)

    # an existing file: replaced, as torch.save does; kept with overwrite=False
    out = os.path.join(tmp, "existing.pt")
    open(out, "wb").write(b"old")
    dcp_to_torch_save(dcp_dir(trainer), out)
    compare("replacing a file", out, ref)
    before = open(out, "rb").read()
    try:
        dcp_to_torch_save(dcp_dir(trainer), out, overwrite=False)
        fail("overwrite=False replaced the file")
    except zckpt.Error as e:
        if out not in str(e):
            fail(f"overwrite=False: {e}")
    if open(out, "rb").read() != before:
        fail("overwrite=False changed the file")

    # refused: not a DCP, a flipped bit, a missing data file; nothing left at the path
    os.makedirs(os.path.join(tmp, "refused"))
    ds = os.path.join(SRC, "tests", "fixtures", "deepspeed", "s3w3_fp32")
    expect_refused("a DeepSpeed checkpoint", ds, os.path.join(tmp, "refused", "ds.pt"), ds)
    case = "llama_tied_w2_fp32"
    d = os.path.join(tmp, "bitflip")
    shutil.copytree(os.path.join(ROOT, case), d)
    md = pickle.load(open(os.path.join(d, ".metadata"), "rb"))
    info = next(v for k, v in md.storage_data.items() if k.fqn == "model.model.embed_tokens.weight")
    data = bytearray(open(os.path.join(d, info.relative_path), "rb").read())
    item = bytes(data[info.offset:info.offset + info.length])
    t = torch.load(__import__("io").BytesIO(item))
    data[info.offset + item.index(t.contiguous().view(torch.uint8).numpy().tobytes()) + 5] ^= 0x10
    open(os.path.join(d, info.relative_path), "wb").write(data)
    if torch.equal(torch_model(d, tmp)["model.embed_tokens.weight"],
                   torch_model(os.path.join(ROOT, case), tmp)["model.embed_tokens.weight"]):
        fail("bitflip: torch's output did not change (the test is wrong)")
    expect_refused("bitflip", d, os.path.join(tmp, "refused", "flip.pt"), info.relative_path)
    try:   # the job underneath: a damaged input is an error, never a silent return with nothing written
        zckpt.consolidate(d, os.path.join(tmp, "refused", "flip-dir"), progress=False)
        fail("zckpt.consolidate of a damaged DCP returned")
    except zckpt.Error as e:
        if e.status != "damaged":
            fail(f"zckpt.consolidate of a damaged DCP: status {e.status!r}: {e}")
    expect_refused("bitflip, .pth", d, os.path.join(tmp, "refused", "flip.pth"), info.relative_path)
    expect_refused("bitflip over an earlier file", d, out, info.relative_path, before=before)
    d = os.path.join(tmp, "missing")
    shutil.copytree(os.path.join(ROOT, case), d)
    os.unlink(os.path.join(d, "__1_0.distcp"))
    expect_refused("missing .distcp", d, os.path.join(tmp, "refused", "missing.pt"), "__1_0.distcp")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
