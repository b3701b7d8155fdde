"""interop_h5_edits.py: a zckpt HDF5 container edited with h5py + hdf5plugin is refused.

`zckpt to-universal --format hdf5` of deepspeed/s3w2_bf16 (plus a side file), then each edit a
user of h5py can make, every one valid HDF5 (hdf5plugin recompresses an edited chunk with a
valid zstd checksum):
  - two params' fp32 swapped by name; a param's fp32 and exp_avg swapped;
  - one element overwritten in place; a dataset deleted and made again with other values and
    the same dtype attribute;
  - an element of a frozen param, of a buffer, of /resume_state, of a side file;
  - /resume_state or a side file deleted; a side file added.
For each: `zckpt consolidate` and `zckpt reshard` exit 1 with one line naming the file and
(for edited data) the dataset, and write nothing; `zckpt verify` exits 3 with a damaged line;
`zckpt inspect` (which reads no tensor data) succeeds, except where a dataset was deleted or
added (refused at open). The intact container passes all of them. Exit 77 without h5py /
hdf5plugin.
"""
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import h5py
    import hdf5plugin
    import numpy as np
except ImportError:
    print("SKIP: h5py / hdf5plugin / numpy not installed")
    sys.exit(77)

zckpt = os.environ["ZCK_BIN"]
fixtures = os.environ.get("ZCK_FIXTURES", os.path.join(os.path.dirname(__file__), "..", "fixtures"))


def run(*args):
    p = subprocess.run([zckpt, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def swap(f, a, b):
    f.move(a, "tmp")
    f.move(b, a)
    f.move("tmp", b)


def poke(f, path, at=0):
    d = f[path]
    a = d[()]
    a.flat[at] = a.flat[at] + 1
    d[...] = a


def remake(f, path):
    d = f[path]
    a, attrs = d[()], dict(d.attrs)
    del f[path]
    n = f.create_dataset(path, data=(a + 1).astype(a.dtype), **hdf5plugin.Zstd())
    for k, v in attrs.items():
        n.attrs[k] = v


SIDE = "side_files/trainer_state.json"
EDITS = [  # (what, edit, the dataset the line names or None, consolidate reads it, open refuses it)
    ("params swapped", lambda f: swap(f, "params/ln.weight/fp32", "params/ln.bias/fp32"), "/params/ln.", True, False),
    ("fp32 and exp_avg swapped", lambda f: swap(f, "params/fc1.weight/fp32", "params/fc1.weight/exp_avg"),
     "/params/fc1.weight/", True, False),
    ("element edited", lambda f: poke(f, "params/fc1.weight/fp32"), "/params/fc1.weight/fp32", True, False),
    ("dataset made again", lambda f: remake(f, "params/fc2.weight/fp32"), "/params/fc2.weight/fp32", True, False),
    ("frozen param edited", lambda f: poke(f, "frozen/frozen.weight", 3), "/frozen/frozen.weight", True, False),
    ("buffer edited", lambda f: poke(f, "buffers/shift"), "/buffers/shift", True, False),
    ("resume_state edited", lambda f: poke(f, "resume_state", 5), "/resume_state", False, False),
    ("side file edited", lambda f: poke(f, SIDE, 1), "/" + SIDE, False, False),
    ("resume_state deleted", lambda f: f.__delitem__("resume_state"), None, True, True),
    ("side file deleted", lambda f: f.__delitem__(SIDE), None, True, True),
    ("side file added", lambda f: f.create_dataset("side_files/extra.json", data=np.frombuffer(b"xyz", np.uint8)), None,
     True, True),
]


def main():
    failures = []
    with tempfile.TemporaryDirectory() as t:
        src = os.path.join(t, "src")
        shutil.copytree(os.path.join(fixtures, "deepspeed", "s3w2_bf16", "ckpt"), src)
        with open(os.path.join(src, "trainer_state.json"), "w") as f:
            f.write('{"global_step": 2}')
        h5 = os.path.join(t, "c.h5")
        rc, out = run("to-universal", "-q", "--format", "hdf5", src, h5)
        assert rc == 0, out
        for args in (["consolidate", "-q", h5, os.path.join(t, "ok.safetensors")],
                     ["reshard", "-q", h5, os.path.join(t, "ok-r"), "--to-world-size", "1"], ["verify", h5],
                     ["inspect", h5]):
            rc, out = run(*args)
            assert rc == 0, f"intact container: {args[0]}: exit {rc}: {out}"
        for what, edit, names, cons_reads, at_open in EDITS:
            before = len(failures)
            bad = os.path.join(t, "d.h5")
            shutil.copy(h5, bad)
            with h5py.File(bad, "r+") as f:
                edit(f)
            want = names or "a dataset deleted or added"
            for job, args, out_path, reads in (
                    ("consolidate", ["-q", bad, os.path.join(t, "o.safetensors")], os.path.join(t, "o.safetensors"),
                     cons_reads),
                    ("reshard", ["-q", bad, os.path.join(t, "o-r"), "--to-world-size", "1"], os.path.join(t, "o-r"),
                     True)):
                rc, out = run(job, *args)
                if not reads and rc == 0:
                    os.remove(out_path)   # consolidate takes no optimizer state nor this side file
                    continue
                lines = out.strip().splitlines()
                if rc != 1 or len(lines) != 1 or bad not in lines[0] or want not in lines[0] or "damaged" not in lines[0]:
                    failures.append(f"{what}: {job}: exit {rc}: {out.strip()}")
                if os.path.exists(out_path):
                    failures.append(f"{what}: {job} left {out_path}")
                    shutil.rmtree(out_path, ignore_errors=True) if os.path.isdir(out_path) else os.remove(out_path)
            rc, out = run("verify", bad)
            if rc != 3 or not any(ln.startswith("damaged:") and want in ln for ln in out.splitlines()):
                failures.append(f"{what}: verify: exit {rc}: {out.strip()}")
            rc, out = run("inspect", bad)
            if (rc == 0) == at_open:
                failures.append(f"{what}: inspect: exit {rc}: {out.strip()[:300]}")
            print(f"{'ok' if len(failures) == before else 'FAILED'}: {what}")
    for x in failures:
        print("FAIL:", x)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
