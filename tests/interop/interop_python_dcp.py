"""interop_python_dcp.py LIBZCKPT: zckpt.dcp_to_torch_save against torch's own, run live.

torch.distributed.checkpoint.format_utils.dcp_to_torch_save(dir, path) runs now, and
zckpt.dcp_to_torch_save(dir, path) must write the same file byte for byte (sha256), for:
  - every real DCP fixture under tests/fixtures/dcp/<case> (FSDP2 folders with Adam state
    and param groups, torchtitan's step-N, Accelerate's and the HF Trainer's
    pytorch_model_fsdp_0), saved as a .pt and as a .pth (the zip folder is the stem);
  - a DCP torch saves here and now in one process: 300 tensors (fp32, bf16, a 0-d one)
    and plain values nested in dicts, lists and tuples, 1-character and empty strings, bytes
    (more storages than the fixtures: torch's serialization id over more rehashes of its
    record-name set, and CPython's shared small strings in the pickle's memo);
  - the HF Trainer's checkpoint-N and output_dir given as dcp_checkpoint_dir (= torch's file
    of the model folder they hold).
Also: an existing file is replaced (as torch.save does), or kept with overwrite=False; a
DeepSpeed checkpoint, a bit flipped inside a chunk (torch's returns the wrong weight
silently), a missing .distcp and a value that is a class instance are refused with
zckpt.Error in one line naming the file, and nothing is left at the path (an earlier file
there stays as it was). A 128 MiB tensor streams through: the job's peak RSS stays under
64 MB.
"""
import hashlib
import io
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import warnings

os.environ["ZCKPT_LIBRARY"] = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "python"))

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as torch_dcp_to_torch_save  # noqa: E402

import zckpt  # noqa: E402
from zckpt.dcp import dcp_to_torch_save  # noqa: E402

warnings.filterwarnings("ignore")   # dcp.save without a process group says so
ROOT = os.path.join(SRC, "tests", "fixtures", "dcp")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def dcp_dir(case_dir):
    for sub in (os.path.join("checkpoint-2", "pytorch_model_fsdp_0"), "step-3"):
        if os.path.isdir(os.path.join(case_dir, sub)):
            return os.path.join(case_dir, sub)
    return case_dir


def same_file(what, folder, name, tmp, ours_from=None):
    """torch's file of folder and zckpt's of ours_from (default folder), both named name."""
    for side in ("torch", "zckpt"):
        os.makedirs(os.path.join(tmp, side), exist_ok=True)
    ref, out = os.path.join(tmp, "torch", name), os.path.join(tmp, "zckpt", name)
    torch_dcp_to_torch_save(folder, ref)
    got = dcp_to_torch_save(ours_from or folder, out)
    if got != out:
        fail(f"{what}: returned {got}, not {out}")
    if sha(out) != sha(ref):
        fail(f"{what}: zckpt's file differs from torch's ({os.path.getsize(out)} vs {os.path.getsize(ref)} bytes)")
    return ref, out


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
    # st_*: safetensors storage, which dcp_to_torch_save does not read (interop_dcp_safetensors.py)
    for case in sorted(c for c in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, c)) and not c.startswith("st_")):
        folder = dcp_dir(os.path.join(ROOT, case))
        for name in ("full.pt", "weights.pth"):
            ref, out = same_file(f"{case} {name}", folder, f"{case}-{name}", tmp)
        sd = torch.load(out, weights_only=False)
        print(f"{case}: = torch's file byte for byte, .pt and .pth ({len(sd)} top-level keys)")

    # a DCP torch saves now: many storages, nested plain values, CPython's shared strings
    g = torch.Generator().manual_seed(0)
    gen = os.path.join(tmp, "gen")
    model = {f"layers.{i}.w": torch.randn(i % 3 + 1, 2, generator=g) for i in range(300)}
    for i in range(0, 300, 7):
        model[f"layers.{i}.w"] = model[f"layers.{i}.w"].to(torch.bfloat16)
    dcp.save({"model": model, "step": torch.tensor(3.0),
              "extra": {"a": 1, "b": [1, 2.5, {"x": "y", "": ""}], "t": (0.9, 0.99), "k": None, "raw": b"\x00\x01"},
              "groups": [{"lr": 0.1, "params": ["a", "b"]}, {"lr": 0.2, "params": ["x"]}], "epoch": 7},
             checkpoint_id=gen)
    same_file("torch's dcp.save of a nested dict", gen, "gen.pt", tmp)
    print("a fresh dcp.save (300 tensors, nested plain values): = torch's file byte for byte")

    # memory: a 128 MiB tensor streams through; the job's process (zckpt without torch) stays
    # far below the file's size, while torch holds the whole state dict
    big = os.path.join(tmp, "big")
    dcp.save({"model": {"w": torch.arange(32 << 20, dtype=torch.float32).view(1 << 12, -1)}}, checkpoint_id=big)
    torch_dcp_to_torch_save(big, os.path.join(tmp, "torch", "big.pt"))
    # (VmHWM: ru_maxrss of a child counts its parent's peak from before the exec)
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); from zckpt.dcp import dcp_to_torch_save; "
             "dcp_to_torch_save(sys.argv[2], sys.argv[3]); "
             "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))")
    os.makedirs(os.path.join(tmp, "zckpt"), exist_ok=True)
    r = subprocess.run([sys.executable, "-c", probe, os.path.join(SRC, "python"), big, os.path.join(tmp, "zckpt", "big.pt")],
                       capture_output=True, text=True)
    if r.returncode:
        fail(f"128 MiB tensor: {r.stderr.strip().splitlines()[-1:]}")
    else:
        rss_mb = int(r.stdout.split()[-1]) / 1024
        if sha(os.path.join(tmp, "zckpt", "big.pt")) != sha(os.path.join(tmp, "torch", "big.pt")):
            fail("128 MiB tensor: zckpt's file differs from torch's")
        if rss_mb > 64:
            fail(f"128 MiB tensor: peak RSS {rss_mb:.0f} MB (the data must stream)")
        print(f"a 128 MiB tensor: = torch's file byte for byte, peak RSS {rss_mb:.0f} MB")
    for x in ("torch", "zckpt"):
        os.unlink(os.path.join(tmp, x, "big.pt"))
    shutil.rmtree(big)

    # an HF Trainer output_dir and its checkpoint-N are taken as the folder they hold
    trainer = os.path.join(ROOT, "hf_trainer_tied_w2_fp32")
    for folder in (trainer, os.path.join(trainer, "checkpoint-2")):
        same_file(f"HF Trainer {os.path.relpath(folder, ROOT)}", dcp_dir(trainer), "trainer.pt", tmp, ours_from=folder)

    # an existing file: replaced, as torch.save does; kept with overwrite=False
    out = os.path.join(tmp, "existing.pt")
    open(out, "wb").write(b"old")
    dcp_to_torch_save(dcp_dir(trainer), out)
    before = open(out, "rb").read()
    if before == b"old":
        fail("the existing file was not replaced")
    try:
        dcp_to_torch_save(dcp_dir(trainer), out, overwrite=False)
        fail("overwrite=False replaced the file")
    except zckpt.Error as e:
        if out not in str(e):
            fail(f"overwrite=False: {e}")
    if open(out, "rb").read() != before:
        fail("overwrite=False changed the file")

    # refused: not a DCP, a flipped bit, a missing data file, a class instance; nothing left
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
    t = torch.load(io.BytesIO(item))
    data[info.offset + item.index(t.contiguous().view(torch.uint8).numpy().tobytes()) + 5] ^= 0x10
    open(os.path.join(d, info.relative_path), "wb").write(data)
    torch_dcp_to_torch_save(d, os.path.join(tmp, "flip-torch.pt"))
    if sha(os.path.join(tmp, "flip-torch.pt")) == sha(os.path.join(tmp, "torch", f"{case}-full.pt")):
        fail("bitflip: torch's output did not change (the test is wrong)")
    expect_refused("bitflip", d, os.path.join(tmp, "refused", "flip.pt"), info.relative_path)
    expect_refused("bitflip, .pth", d, os.path.join(tmp, "refused", "flip.pth"), info.relative_path)
    expect_refused("bitflip over an earlier file", d, out, info.relative_path, before=before)
    d = os.path.join(tmp, "missing")
    shutil.copytree(os.path.join(ROOT, case), d)
    os.unlink(os.path.join(d, "__1_0.distcp"))
    expect_refused("missing .distcp", d, os.path.join(tmp, "refused", "missing.pt"), "__1_0.distcp")
    from fractions import Fraction
    d = os.path.join(tmp, "object")
    dcp.save({"w": torch.ones(2), "ratio": Fraction(1, 3)}, checkpoint_id=d)
    torch_dcp_to_torch_save(d, os.path.join(tmp, "object-torch.pt"))   # torch pickles the class as it likes
    expect_refused("a class instance", d, os.path.join(tmp, "refused", "object.pt"), "__0_0.distcp")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
