"""test_hf.py: zckpt.hf's file-level behaviour with the standard library only (no torch, no transformers):
manifests of HF checkpoint-N folders, completeness, prepare_resume's decisions, reshard beside the checkpoint,
RNG files, reuse, and the wait of several ranks before a process group exists. The Trainer itself is
exercised by tests/interop/interop_hf_trainer.py.
Run: python test_hf.py (ZCKPT_LIBRARY names the library, ZCK_FIXTURES the fixtures).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

import zckpt
import zckpt.hf as zh

FX = os.environ.get("ZCK_FIXTURES") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
SRC = os.path.join(FX, "deepspeed", "s1w3_fp32", "ckpt")   # ZeRO-1, 3 ranks, tag global_step2


def hf_checkpoint(root, name="checkpoint-2"):
    """The fixture laid out as the Trainer saves it: DeepSpeed's files plus the Trainer's own."""
    d = os.path.join(root, name)
    shutil.copytree(SRC, d)
    for f, text in [("trainer_state.json", '{"global_step": 2}'), ("config.json", "{}"), ("scheduler.pt", "s")] + \
            [(f"rng_state_{r}.pth", f"rng{r}") for r in range(3)]:
        with open(os.path.join(d, f), "w") as fh:
            fh.write(text)
    return d


def read(p):
    with open(p) as f:
        return f.read()


class Hf(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_import_needs_no_torch_or_transformers(self):
        r = subprocess.run([sys.executable, "-c", "import sys, zckpt.hf; "
                            "print([m for m in ('torch', 'transformers', 'numpy') if m in sys.modules])"],
                           capture_output=True, text=True)
        self.assertEqual(r.stdout.strip(), "[]", r.stderr)

    def test_manifest_and_completeness(self):
        a = hf_checkpoint(self.tmp, "checkpoint-2")
        b = hf_checkpoint(self.tmp, "checkpoint-10")
        self.assertFalse(zh.is_complete(a))
        self.assertIsNone(zh.last_complete_checkpoint(self.tmp))
        path = zh.write_manifest(a)
        self.assertEqual(path, os.path.join(a, "global_step2", zh.MANIFEST_NAME))
        rep = zckpt.verify(a)
        self.assertTrue(rep.clean, rep.findings)
        self.assertEqual(rep.manifest, path)
        self.assertTrue(zh.is_complete(a))
        # checkpoint-10 is newer (by number, not by name) but has no manifest: an interrupted save
        self.assertEqual(zh.last_complete_checkpoint(self.tmp), a)
        zh.write_manifest(b)
        self.assertEqual(zh.last_complete_checkpoint(self.tmp), b)
        # a listed file gone: not complete
        os.unlink(os.path.join(b, "global_step2", "zero_pp_rank_2_mp_rank_00_optim_states.pt"))
        self.assertFalse(zh.is_complete(b))
        self.assertEqual(zh.last_complete_checkpoint(self.tmp), a)

    def test_manifest_without_deepspeed_goes_into_the_folder(self):
        d = os.path.join(self.tmp, "checkpoint-1")
        os.makedirs(d)
        with open(os.path.join(d, "trainer_state.json"), "w") as f:
            f.write("{}")
        self.assertEqual(zh.write_manifest(d), os.path.join(d, zh.MANIFEST_NAME))
        self.assertTrue(zh.is_complete(d))
        self.assertEqual(zh.prepare_resume(d, world_size=2), d)

    def test_fsdp_checkpoint(self):
        # the HF Trainer's own FSDP save (SHARDED_STATE_DICT): verified before its manifest, which goes
        # into checkpoint-N and lists the Trainer's files too
        d = os.path.join(self.tmp, "checkpoint-2")
        shutil.copytree(os.path.join(FX, "dcp", "hf_trainer_tied_w2_fp32", "checkpoint-2"), d)
        self.assertEqual(zh.checkpoint_dcp_dir(d), os.path.join(d, "pytorch_model_fsdp_0"))
        self.assertEqual(zh.write_manifest(d), os.path.join(d, zh.MANIFEST_NAME))
        rep = zckpt.verify(d)
        self.assertTrue(rep.clean and not rep.findings, rep.findings)
        self.assertTrue(zh.is_complete(d))
        self.assertEqual(zh.prepare_resume(d, world_size=3), d)   # torch reshards a DCP on load
        os.unlink(os.path.join(d, "optimizer_0", "__1_0.distcp"))
        self.assertFalse(zh.is_complete(d))
        with self.assertRaises(zckpt.Error) as e:
            zh.prepare_resume(d, world_size=2)
        self.assertIn("incomplete checkpoint", str(e.exception))
        # a damaged one gets no manifest
        os.unlink(os.path.join(d, zh.MANIFEST_NAME))
        with self.assertRaises(zckpt.Error) as e:
            zh.write_manifest(d)
        self.assertIn("__1_0.distcp", str(e.exception))
        self.assertFalse(os.path.exists(os.path.join(d, zh.MANIFEST_NAME)))

    def test_prepare_resume_same_layout_is_unchanged(self):
        a = hf_checkpoint(self.tmp)
        self.assertEqual(zh.prepare_resume(a, world_size=3), a)
        self.assertEqual(zh.prepare_resume(a, world_size=3, zero_stage=1), a)
        self.assertEqual(sorted(os.listdir(self.tmp)), ["checkpoint-2"])

    def test_prepare_resume_reshards_beside(self):
        a = hf_checkpoint(self.tmp)
        out = zh.prepare_resume(a, world_size=2, zero_stage=2)
        self.assertEqual(os.path.dirname(out), self.tmp)
        self.assertTrue(os.path.basename(out).startswith("resharded-checkpoint-2-w2-zero2-"), out)
        info = zckpt.inspect(out)
        self.assertEqual((info["world_size"], info["stage"]), (2, 2))
        self.assertEqual(read(os.path.join(out, "trainer_state.json")), '{"global_step": 2}')
        self.assertEqual(read(os.path.join(out, "rng_state_0.pth")), "rng0")
        self.assertEqual(read(os.path.join(out, "rng_state_1.pth")), "rng1")
        self.assertFalse(os.path.exists(os.path.join(out, "rng_state_2.pth")))
        self.assertTrue(zckpt.verify(out).clean)
        # nothing else beside it (no temporary left), and a second call reuses it
        self.assertEqual(sorted(os.listdir(self.tmp)), sorted(["checkpoint-2", os.path.basename(out)]))
        mtime = os.stat(out).st_mtime_ns
        self.assertEqual(zh.prepare_resume(a, world_size=2, zero_stage=2), out)
        self.assertEqual(os.stat(out).st_mtime_ns, mtime)
        # the checkpoint saved again: a new folder, never the stale one
        os.unlink(os.path.join(a, "trainer_state.json"))
        with open(os.path.join(a, "trainer_state.json"), "w") as f:
            f.write('{"global_step": 2, "again": true}')
        again = zh.prepare_resume(a, world_size=2, zero_stage=2)
        self.assertNotEqual(again, out)
        self.assertIn("again", read(os.path.join(again, "trainer_state.json")))

    def test_prepare_resume_to_one_rank_renames_rng_state(self):
        a = hf_checkpoint(self.tmp)
        out = zh.prepare_resume(a, world_size=1)
        self.assertEqual(read(os.path.join(out, "rng_state.pth")), "rng0")  # what the Trainer reads at W=1
        self.assertEqual([f for f in os.listdir(out) if f.startswith("rng_state")], ["rng_state.pth"])
        back = zh.prepare_resume(out, world_size=2)
        self.assertEqual(read(os.path.join(back, "rng_state_0.pth")), "rng0")

    def test_prepare_resume_refuses_an_incomplete_save(self):
        a = hf_checkpoint(self.tmp)
        open(os.path.join(a, "global_step2", ".zckpt-partial"), "w").close()
        for w in (3, 2):
            with self.assertRaises(zckpt.Error) as e:
                zh.prepare_resume(a, world_size=w)
            self.assertIn("incomplete checkpoint", str(e.exception))
        self.assertEqual(sorted(os.listdir(self.tmp)), ["checkpoint-2"])

    def test_prepare_resume_outside_a_launch_refuses_to_guess(self):
        a = hf_checkpoint(self.tmp)
        env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
        script = f"import zckpt.hf as zh; print(zh.prepare_resume({a!r}))"
        p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("not part of a distributed launch", p.stderr)
        self.assertIn("world_size=1", p.stderr)
        self.assertEqual(sorted(os.listdir(self.tmp)), ["checkpoint-2"])  # nothing written beside it
        # asked for: one process
        self.assertTrue(os.path.basename(zh.prepare_resume(a, world_size=1)).startswith("resharded-checkpoint-2-w1-"))

    def test_prepare_resume_bad_arguments(self):
        a = hf_checkpoint(self.tmp)
        with self.assertRaises(zckpt.Error):
            zh.prepare_resume(a, world_size=2, zero_stage=4)

    def test_ranks_without_process_group_wait_for_rank_0(self):
        a = hf_checkpoint(self.tmp)
        script = textwrap.dedent(f"""
            import zckpt.hf as zh
            print(zh.prepare_resume({a!r}, zero_stage=2, poll_s=0.05))
        """)
        procs = []
        for rank in (1, 0):  # the waiting rank first: it must not go on before rank 0 is done
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2")
            procs.append(subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = [p.communicate() for p in procs]
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
        paths = [o.strip() for o, _ in outs]
        self.assertEqual(paths[0], paths[1])
        self.assertTrue(os.path.basename(paths[0]).startswith("resharded-checkpoint-2-w2-zero2-"), paths)
        self.assertEqual(zckpt.inspect(paths[0])["world_size"], 2)


class HfWithoutTransformers(unittest.TestCase):
    def test_callback_names_the_extra(self):
        try:
            import transformers  # noqa: F401
            self.skipTest("transformers is installed")
        except ImportError:
            pass
        with self.assertRaises(ImportError) as cm:
            zh.ZckptCallback
        self.assertIn("pip install 'zckpt[hf]'", str(cm.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
