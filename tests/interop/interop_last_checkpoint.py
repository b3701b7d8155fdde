"""interop_last_checkpoint.py: `zckpt consolidate OUTPUT_DIR` takes the checkpoint-N that
transformers' trainer_utils.get_last_checkpoint returns when every candidate is complete:
names like checkpoint-7, checkpoint-007, checkpoint-10, checkpoint-100 (numbers, not
strings), links to folders, and entries that are not candidates (files, checkpoint-5x,
xcheckpoint-9, checkpoint-). Each candidate holds another fixture checkpoint, so the
output's bytes say which one was read."""
import filecmp
import os
import random
import subprocess
import sys
import tempfile

from transformers.trainer_utils import get_last_checkpoint

zckpt = os.environ["ZCK_BIN"]
fixtures = os.environ.get("ZCK_FIXTURES", os.path.join(os.path.dirname(__file__), "..", "fixtures"))
ds = os.path.join(fixtures, "deepspeed")
sources = [os.path.join(ds, c, "ckpt") for c in sorted(os.listdir(ds)) if os.path.isfile(os.path.join(ds, c, "ckpt", "latest"))
           and "bf16optimizer" not in c][:8]
failures, checked = [], 0


def consolidate(src, out):
    r = subprocess.run([zckpt, "consolidate", "-q", src, out], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"FAIL zckpt consolidate {src}: {r.stderr.strip()}")


rng = random.Random(14)
names = ["checkpoint-7", "checkpoint-007", "checkpoint-10", "checkpoint-100", "checkpoint-99", "checkpoint-1000",
         "checkpoint-0", "checkpoint-12345678901234567890", "checkpoint-12345678901234567889"]
with tempfile.TemporaryDirectory() as tmp:
    for round_ in range(8):
        od = os.path.join(tmp, f"od{round_}")
        os.makedirs(od)
        picked = rng.sample(names, rng.randint(1, 4))
        for i, name in enumerate(picked):
            src = sources[(round_ + i) % len(sources)]
            if i % 2:
                os.symlink(src, os.path.join(od, name))          # a link to a folder counts
            else:
                subprocess.run(["cp", "-r", src, os.path.join(od, name)], check=True)
        for junk in ("checkpoint-5000x", "xcheckpoint-9000", "checkpoint-"):
            os.symlink(sources[0], os.path.join(od, junk))
        with open(os.path.join(od, "checkpoint-99999"), "w") as f:   # a file, not a folder
            f.write("not a checkpoint")
        want = get_last_checkpoint(od)
        ours, theirs = os.path.join(tmp, f"ours{round_}.safetensors"), os.path.join(tmp, f"ref{round_}.safetensors")
        consolidate(od, ours)
        consolidate(want, theirs)
        checked += 1
        if not filecmp.cmp(ours, theirs, shallow=False):
            failures.append(f"{sorted(picked)}: zckpt did not read {os.path.basename(want)}")
for f in failures:
    print("FAIL", f)
print(f"{checked} output_dirs: zckpt read get_last_checkpoint's checkpoint; {len(failures)} failures")
sys.exit(1 if failures or not checked else 0)
