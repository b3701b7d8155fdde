"""test_api.py: the zckpt Python package as installed (a wheel in a fresh venv with its
declared dependencies, or the source tree with $ZCKPT_LIBRARY), needing no torch.

Checks each job against the zckpt command's own results, errors as zckpt.Error with the
one-line message, progress reports, cancellation by the callback and by Ctrl-C (nothing
left at OUT or beside it), that importing the package pulls in neither torch nor numpy,
and the zero_to_fp32 state dict as numpy arrays (where numpy is installed, torch not).
Run: python test_api.py (ZCK_FIXTURES and ZCK_BIN name the fixtures and a zckpt program).
"""
import ctypes
import filecmp
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import zckpt
import zckpt._native as N

FX = os.environ.get("ZCK_FIXTURES") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
DS = os.path.join(FX, "deepspeed")
CKPT = os.path.join(DS, "s3w2_bf16", "ckpt")
BIN = os.environ.get("ZCK_BIN", "zckpt")


def listing(d):
    return sorted(os.listdir(d))


HEADER = os.environ.get("ZCK_HEADER") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "zck.h")


def header_structs(text):
    """zck.h's structs: {name: [(field, C type), ...]}, from its `typedef struct X { ... } X;` blocks."""
    structs = {}
    for m in re.finditer(r"typedef struct (zck_\w+) \{(.*?)\n\} \1;", text, re.S):
        body = re.sub(r"/\*.*?\*/", "", m.group(2), flags=re.S)
        fields = []
        for decl in body.split(";"):
            decl = " ".join(decl.split())
            if decl:
                f = re.match(r"(.*?)\s*\b(\w+)$", decl)
                fields.append((f.group(2), f.group(1).replace(" *", "*")))
        structs[m.group(1)] = fields
    return structs


class Mirror(unittest.TestCase):
    """_native.py declares zck.h's structs field for field, with the C types' ctypes."""

    CTYPES = {"const char*": ctypes.c_char_p, "void*": ctypes.c_void_p, "size_t": ctypes.c_size_t,
              "int": ctypes.c_int, "unsigned": ctypes.c_uint, "uint32_t": ctypes.c_uint32,
              "uint64_t": ctypes.c_uint64, "int64_t": ctypes.c_int64}

    def ctype(self, c):
        if c in self.CTYPES:
            return self.CTYPES[c]
        if c == "zck_progress_cb":
            return N.PROGRESS
        if c in ("zck_dtype", "zck_output_format", "zck_universal_format", "zck_reshard_format", "zck_reshard_offload", "zck_tensor_role",
                 "zck_verify_result", "zck_verify_severity"):
            return ctypes.c_int   # enums
        if c == "const int64_t*":
            return ctypes.POINTER(ctypes.c_int64)
        if c == "const zck_verify_finding*":
            return ctypes.POINTER(N.VerifyFinding)
        if c == "zck_job_summary*":
            return ctypes.POINTER(N.JobSummary)
        self.fail(f"zck.h type {c!r}: no ctypes equivalent known to this test")

    def test_structs_mirror_zck_h(self):
        if not os.path.exists(HEADER):
            self.skipTest("zck.h not found (set ZCK_HEADER)")
        with open(HEADER) as f:
            structs = header_structs(f.read())
        pairs = {"zck_consolidate_opts": N.ConsolidateOpts, "zck_reshard_opts": N.ReshardOpts,
                 "zck_universal_opts": N.UniversalOpts, "zck_inspect_opts": N.InspectOpts,
                 "zck_verify_opts": N.VerifyOpts, "zck_verify_finding": N.VerifyFinding,
                 "zck_verify_report": N.VerifyReport, "zck_tensor_desc": N.TensorDesc,
                 "zck_job_summary": N.JobSummary}
        for cname, cls in pairs.items():
            self.assertIn(cname, structs)
            want = [(f, self.ctype(t)) for f, t in structs[cname]]
            have = list(cls._fields_)
            self.assertEqual([f for f, _ in have], [f for f, _ in want], cname)
            for (f, a), (_, b) in zip(have, want):
                self.assertIs(a, b, f"{cname}.{f}")
        # every option struct of the jobs starts with its size, and new() sets it
        for cls in (N.ConsolidateOpts, N.ReshardOpts, N.UniversalOpts, N.InspectOpts):
            self.assertEqual(cls._fields_[0][0], "size")
            self.assertEqual(cls.new().size, ctypes.sizeof(cls))


class Api(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_import_needs_neither_torch_nor_numpy(self):
        r = subprocess.run([sys.executable, "-c", "import sys, zckpt; print('torch' in sys.modules, 'numpy' in sys.modules)"],
                           capture_output=True, text=True, check=True)
        self.assertEqual(r.stdout.strip(), "False False")

    def test_consolidate_equals_the_command(self):
        ours = os.path.join(self.tmp, "py.safetensors")
        cli = os.path.join(self.tmp, "cli.safetensors")
        calls = []
        self.assertEqual(zckpt.consolidate(CKPT, ours, progress=lambda d, t: calls.append((d, t))), ours)
        subprocess.run([BIN, "consolidate", "-q", CKPT, cli], check=True)
        self.assertTrue(filecmp.cmp(ours, cli, shallow=False))
        self.assertTrue(calls, "progress was never reported")
        self.assertEqual(calls[-1][0], calls[-1][1])   # done == total at the end
        self.assertTrue(all(a[0] <= b[0] for a, b in zip(calls, calls[1:])))

    def test_sizes_read_as_the_command_reads_them(self):
        # one parser for both: "2K" and " 2 kb " shard as "2KB" does, in Python and on the CLI
        for spelling in ("2K", " 2 kb "):
            out, cli = (os.path.join(self.tmp, f"{w}-{spelling.strip()}") for w in ("py", "cli"))
            zckpt.consolidate(CKPT, out, max_shard_size=spelling, progress=False)
            subprocess.run([BIN, "consolidate", "-q", "--max-shard-size", spelling, CKPT, cli], check=True)
            self.assertEqual(listing(out), listing(cli))
            self.assertIn("model.safetensors.index.json", listing(out))
        with self.assertRaisesRegex(zckpt.Error, "size '5XB'"):
            zckpt.consolidate(CKPT, os.path.join(self.tmp, "bad"), max_shard_size="5XB", progress=False)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "bad")))

    def test_reshard_offload_reaches_the_library(self):
        with self.assertRaisesRegex(zckpt.Error, "offload 'ssd'"):
            zckpt.reshard(CKPT, os.path.join(self.tmp, "x"), world_size=3, offload="ssd", progress=False)
        # the library's own refusal, so the field arrived: NVMe swap files are ZeRO-3's
        bad = os.path.join(self.tmp, "nvme2")
        with self.assertRaises(zckpt.Error) as e:
            zckpt.reshard(CKPT, bad, world_size=3, stage=2, offload="nvme", progress=False)
        cli = subprocess.run([BIN, "reshard", "-q", "--to-stage", "2", "--to-world-size", "3", "--to-offload", "nvme",
                              CKPT, bad], capture_output=True, text=True)
        self.assertNotEqual(cli.returncode, 0)
        self.assertIn(str(e.exception).split(": ", 1)[-1][:40], cli.stderr)
        self.assertFalse(os.path.exists(bad))

    def test_consolidate_folder_dtype_and_shards(self):
        out = os.path.join(self.tmp, "hf")
        zckpt.consolidate(CKPT, out, dtype="bf16", max_shard_size="2KB", progress=False)
        cli = os.path.join(self.tmp, "hf_cli")
        subprocess.run([BIN, "consolidate", "-q", "--dtype", "bf16", "--max-shard-size", "2KB", CKPT, cli], check=True)
        self.assertEqual(listing(out), listing(cli))
        self.assertIn("model.safetensors.index.json", listing(out))
        for f in listing(out):
            if f.endswith(".safetensors"):
                self.assertTrue(filecmp.cmp(os.path.join(out, f), os.path.join(cli, f), shallow=False), f)

    def test_errors_are_one_line(self):
        with self.assertRaises(zckpt.Error) as e:
            zckpt.consolidate(os.path.join(self.tmp, "nope"), os.path.join(self.tmp, "o.safetensors"))
        msg = str(e.exception)
        self.assertIn(os.path.join(self.tmp, "nope"), msg)
        self.assertNotIn("\n", msg)
        self.assertEqual(e.exception.status, "not found")
        self.assertEqual(listing(self.tmp), [])
        with self.assertRaises(zckpt.Error):
            zckpt.consolidate(CKPT, os.path.join(self.tmp, "o.safetensors"), dtype="int3")
        out = os.path.join(self.tmp, "o.safetensors")
        zckpt.consolidate(CKPT, out, progress=False)
        with self.assertRaises(zckpt.Error) as e:
            zckpt.consolidate(CKPT, out, progress=False)
        self.assertEqual(e.exception.status, "already exists")
        zckpt.consolidate(CKPT, out, overwrite=True, progress=False)

    def test_cancel_by_callback_leaves_nothing(self):
        for job in ("consolidate", "reshard", "to_universal", "to_universal_h5"):
            out = os.path.join(self.tmp, job)
            with self.assertRaises(zckpt.Canceled, msg=job) as e:
                if job == "consolidate":
                    zckpt.consolidate(CKPT, out, progress=lambda d, t: True)
                elif job == "reshard":
                    zckpt.reshard(CKPT, out, world_size=3, stage=2, progress=lambda d, t: True)
                elif job == "to_universal":
                    zckpt.to_universal(CKPT, out, progress=lambda d, t: True)
                else:
                    zckpt.to_universal(CKPT, out + ".h5", format="hdf5", progress=lambda d, t: True)
            self.assertEqual(e.exception.status, "canceled")
            self.assertEqual(listing(self.tmp), [], job)   # no output, no temporaries

    def test_callback_exception_cancels_and_propagates(self):
        def boom(d, t):
            raise ValueError("from the callback")
        with self.assertRaises(ValueError):
            zckpt.consolidate(CKPT, os.path.join(self.tmp, "o"), progress=boom)
        self.assertEqual(listing(self.tmp), [])

    def test_ctrl_c_cancels_cleanly(self):
        out = os.path.join(self.tmp, "o")
        code = textwrap.dedent(f"""
            import os, signal, time, zckpt
            def progress(done, total):
                os.kill(os.getpid(), signal.SIGINT)   # a Ctrl-C while the job runs
                time.sleep(1)
            try:
                zckpt.consolidate({CKPT!r}, {out!r}, progress=progress)
            except KeyboardInterrupt:
                print("interrupted")
        """)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.stdout.strip(), "interrupted", r.stderr)
        self.assertEqual(listing(self.tmp), [])

    def test_reshard_and_universal(self):
        r = os.path.join(self.tmp, "r")
        zckpt.reshard(CKPT, r, world_size=3, stage=1, progress=False)
        info = zckpt.inspect(r)
        self.assertEqual((info["format"], info["stage"], info["world_size"]), ("deepspeed", 1, 3))
        # format="dcp": the CLI's --to-format dcp, the same files but for .metadata's random save_id
        d, dcli = os.path.join(self.tmp, "d"), os.path.join(self.tmp, "dcli")
        zckpt.reshard(CKPT, d, world_size=3, format="dcp", progress=False)
        subprocess.run([BIN, "reshard", "-q", "--to-format", "dcp", "--to-world-size", "3", CKPT, dcli], check=True)
        self.assertEqual(sorted(os.listdir(d)), sorted(os.listdir(dcli)))
        for f in os.listdir(d):
            if f.endswith(".distcp"):
                self.assertTrue(filecmp.cmp(os.path.join(d, f), os.path.join(dcli, f), shallow=False), f)
        self.assertIn("__2_0.distcp", os.listdir(d))
        u = os.path.join(self.tmp, "u.h5")
        zckpt.to_universal(CKPT, u, format="hdf5", progress=False)
        cli = os.path.join(self.tmp, "cli")
        subprocess.run([BIN, "reshard", "-q", "--to-stage", "1", "--to-world-size", "3", CKPT, cli], check=True)
        for dirpath, _, files in os.walk(cli):
            for f in files:
                p = os.path.join(dirpath, f)
                q = os.path.join(r, os.path.relpath(p, cli))
                if f.endswith(".pt"):
                    self.assertTrue(filecmp.cmp(p, q, shallow=False), q)
        # consolidate takes the universal checkpoint too: the same bytes as from the checkpoint
        a, b = os.path.join(self.tmp, "a", "m.safetensors"), os.path.join(self.tmp, "b", "m.safetensors")
        os.makedirs(os.path.dirname(a))
        os.makedirs(os.path.dirname(b))
        zckpt.consolidate(CKPT, a, progress=False)
        zckpt.consolidate(u, b, progress=False)
        self.assertTrue(filecmp.cmp(a, b, shallow=False))

    def test_verify_report(self):
        out = os.path.join(self.tmp, "hf")
        zckpt.consolidate(CKPT, out, progress=False)
        rep = zckpt.verify(out)
        self.assertEqual(rep.result, "clean")
        self.assertTrue(rep)
        self.assertGreater(rep.files, 0)
        self.assertIsNotNone(rep.manifest)
        # damage one byte of the weights: found, named
        p = os.path.join(out, "model.safetensors")
        with open(p, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            b = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([b[0] ^ 0xFF]))
        rep = zckpt.verify(out)
        self.assertEqual(rep.result, "damaged")
        self.assertFalse(rep)
        damage = [f for f in rep.findings if f.severity == "damage"]
        self.assertTrue(damage)
        self.assertTrue(any("model.safetensors" in (f.message or "") for f in damage))

    def test_inspect_dict(self):
        info = zckpt.inspect(CKPT)
        self.assertEqual(info["format"], "deepspeed")
        self.assertEqual(info["stage"], 3)
        self.assertEqual(info["world_size"], 2)
        with self.assertRaises(zckpt.Error):
            zckpt.inspect(os.path.join(self.tmp, "nope.pt"))

    def test_sweep_temporaries(self):
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()   # a writer that is gone
        tree = os.path.join(self.tmp, f".checkpoint-10.zck-tmp-{dead.pid}")
        os.makedirs(os.path.join(tree, "global_step10"))
        aside = os.path.join(self.tmp, f".model.zck-tmp-{dead.pid}.zck-old-{dead.pid}")
        os.makedirs(aside)
        with open(os.path.join(aside, "model.safetensors"), "w") as f:
            f.write("earlier")
        mine = os.path.join(self.tmp, f".live.zck-tmp-{os.getpid()}")   # a running writer's
        open(mine, "w").close()
        self.assertEqual(zckpt.sweep_temporaries(self.tmp), zckpt.Swept(removed=1, restored=1))
        self.assertEqual(listing(self.tmp), [os.path.basename(mine), "model"])
        with open(os.path.join(self.tmp, "model", "model.safetensors")) as f:
            self.assertEqual(f.read(), "earlier")
        with self.assertRaises(zckpt.Error) as e:
            zckpt.sweep_temporaries(os.path.join(self.tmp, "nope"))
        self.assertIn("nope", str(e.exception))
        self.assertEqual(e.exception.status, "not found")

    def test_state_dict_without_torch_or_numpy(self):
        try:
            import numpy  # noqa: F401
            self.skipTest("numpy is installed here")
        except ImportError:
            pass
        with self.assertRaises(zckpt.Error) as e:
            zckpt.get_fp32_state_dict_from_zero_checkpoint(CKPT)
        self.assertIn("torch or numpy", str(e.exception))


class StateDictNumpy(unittest.TestCase):
    """get_fp32_state_dict_from_zero_checkpoint with the wheel's declared dependencies only
    (numpy, ml_dtypes; no torch): numpy arrays holding the bytes `zckpt consolidate` writes,
    the frozen bfloat16 weight as an ml_dtypes array."""

    def test_arrays_equal_the_command(self):
        try:
            import numpy as np
        except ImportError:
            self.skipTest("numpy is not installed here")
        try:
            import torch  # noqa: F401
            self.skipTest("torch is installed here (the state dict holds torch tensors)")
        except ImportError:
            pass
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "model.safetensors")
            subprocess.run([BIN, "consolidate", "-q", CKPT, out], check=True)
            with open(out, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
                data = f.read()
        header.pop("__metadata__", None)
        sd = zckpt.get_fp32_state_dict_from_zero_checkpoint(CKPT)
        # a tied name is the same array as its source (safetensors holds the source only)
        tied = set(sd) - set(header)
        self.assertTrue(set(header) <= set(sd))
        for name in tied:
            self.assertTrue(any(sd[name] is sd[k] for k in header), name)
        dtypes = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64"}
        for name, h in header.items():
            a = sd[name]
            self.assertIsInstance(a, np.ndarray, name)
            self.assertEqual(a.dtype.name, dtypes[h["dtype"]], name)
            self.assertEqual(list(a.shape), h["shape"], name)
            begin, end = h["data_offsets"]
            self.assertEqual(a.tobytes(), data[begin:end], name)
        self.assertIn("BF16", {h["dtype"] for h in header.values()})


if __name__ == "__main__":
    unittest.main(verbosity=1)
