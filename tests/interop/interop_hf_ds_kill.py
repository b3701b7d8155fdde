"""interop_hf_ds_kill.py LIBZCKPT: kill -9 of a real HF Trainer + DeepSpeed run during a save made through
zckpt's DeepSpeed checkpoint engine (ZckptCallback(ds_engine=True)); the previous checkpoint resumes.

The tiny GPT-2 of interop_hf_trainer.py trains at W=2, ZeRO-2, on the CPU (torchrun, gloo), a checkpoint after
every step. The save of checkpoint-2 is made slow (each rank sleeps after writing its first file of
global_step2, a slow disk), and this script kill -9s both ranks from outside once it sees that save under way:
the engine's staging folder checkpoint-2/.global_step2.zck-tmp-<pid>/ holds files, and checkpoint-2 has neither
its tag folder nor `latest`. Checks:
- the run died (the launcher reports the ranks killed by signal 9);
- checkpoint-2 is not complete, last_complete_checkpoint gives checkpoint-1, which verifies clean;
- a resume from it (ZckptCallback(ds_engine=True) again) trains steps 2 and 3 with the losses the killed run
  logged for step 2 (fp32, same samples: within 1e-6 relative) and saves checkpoint-2 and -3 through the engine:
  complete, clean, the killed save's staging folder swept.

With --background the same run saves through ZckptCallback(ds_engine="background"): DeepSpeed's files are written
by a thread per rank while training goes on, and committed at the next optimizer step. Each rank's writer thread
writes half of its first file of global_step2 and then stalls (a slow disk); the kill comes once both ranks
have begun step 3 (training went on after the save) and each rank's file in the staging folder is shorter than
the bytes the thread is writing (the kill lands during a write), while checkpoint-2 already holds the Trainer's
own files (trainer_state.json). The checks after the kill and the resume (in the background too) are the same;
the resume's checkpoint-3, committed by the callback when training ends (no step comes after it), is complete
and clean, and DeepSpeed's zero_to_fp32 reads it. The resume runs with consolidate="every": checkpoint-2 and -3
get consolidated/ once committed, equal to zero_to_fp32 bit for bit.
Exit 0 when everything holds, 1 otherwise, 77 without the packages.
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "fixtures", "gen"))
sys.path.insert(0, os.path.join(SRC, "python"))
sys.path.insert(0, HERE)
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from ds_launch import clean_shm, free_port, torchrun_popen  # noqa: E402
from interop_hf_trainer import GLOBAL_BATCH, build_model, check_zero_to_fp32, dataset, ds_config, end_worker  # noqa: E402

WORLD, STAGE, STEPS, SLOW_TAG = 2, 2, 3, "global_step2"


def slow_background_writes(de, work, rank):
    """Each rank's writer thread writes half of its first file of SLOW_TAG, says so, and stalls."""
    real = de.ZckptCheckpointEngine._write_file
    slowed = []

    def slow_write(self, mem, dst):
        if f"{os.sep}.{SLOW_TAG}.zck-tmp-" in dst and not slowed:   # the tag's staging folder
            slowed.append(dst)
            size = os.path.getsize(mem)
            with open(mem, "rb") as src, open(dst, "wb") as out:
                out.write(src.read(size // 2))
                out.flush()
                os.fsync(out.fileno())
            with open(os.path.join(work, f"writing.{rank}"), "w") as f:
                json.dump({"path": dst, "written": size // 2, "size": size, "memdir": self.memdir}, f)
            time.sleep(120)
        real(self, mem, dst)
    de.ZckptCheckpointEngine._write_file = slow_write


def worker(mode, run_dir, work, resume_from=None, background=False):
    import torch
    from make_hf_peft_fixtures import patch_for_cpu
    import zckpt.hf as zh
    patch_for_cpu()
    from transformers import Trainer, TrainerCallback, TrainingArguments
    # installs the engine before the Trainer makes DeepSpeed's
    # the background resume also consolidates every checkpoint once its save is committed
    callback = zh.ZckptCallback("every" if background and mode == "resume" else None,
                                ds_engine="background" if background else True)
    import zckpt.ds_engine as de
    rank = int(os.environ["RANK"])
    with open(os.path.join(work, f"pid.{mode}.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    if mode == "train" and background:
        slow_background_writes(de, work, rank)
    elif mode == "train":
        real = de.ZckptCheckpointEngine.save
        slowed = []

        def slow_save(self, state_dict, path):
            real(self, state_dict, path)
            if os.sep + SLOW_TAG + os.sep in path and not slowed:   # a slow disk: the kill comes now
                slowed.append(path)
                time.sleep(120)
        de.ZckptCheckpointEngine.save = slow_save

    class Losses(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            open(os.path.join(work, f"step_begin.{mode}.{rank}.{state.global_step + 1}"), "w").close()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs and "loss" in logs:
                with open(os.path.join(work, f"losses.{mode}.jsonl"), "a") as f:
                    f.write(json.dumps({"step": state.global_step, "loss": logs["loss"]}) + "\n")

    args = TrainingArguments(
        output_dir=run_dir, per_device_train_batch_size=GLOBAL_BATCH // WORLD, gradient_accumulation_steps=1,
        max_steps=STEPS, save_strategy="steps", save_steps=1, learning_rate=3e-3, weight_decay=0.1, warmup_steps=0,
        lr_scheduler_type="linear", logging_steps=1, report_to=[], seed=42, data_seed=42, use_cpu=False,
        deepspeed=ds_config(STAGE), dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=build_model(), args=args, train_dataset=dataset(48), callbacks=[callback, Losses()])
    trainer.train(resume_from_checkpoint=resume_from)
    engine = trainer.model_wrapped.checkpoint_engine
    assert isinstance(engine, de.ZckptCheckpointEngine), type(engine)
    assert engine.background == background and engine.pending is None, (engine.background, engine.pending)
    torch.distributed.barrier()


def launch(argv, log):
    port = free_port()
    return torchrun_popen(WORLD, __file__, argv, log, port), port


def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path))} if os.path.exists(path) else {}


def background_write_under_way(ckpt2, work):
    """Both ranks' writer threads are inside a write of checkpoint-2's staging folder and both ranks have
    begun step 3: [(path, bytes on the disk, bytes being written)], or None."""
    begun = glob.glob(os.path.join(work, "step_begin.train.*.3"))
    markers = sorted(glob.glob(os.path.join(work, "writing.*")))
    if len(begun) < WORLD or len(markers) < WORLD:
        return None
    writes = []
    for m in markers:
        try:
            w = json.load(open(m))
            writes.append((w["path"], os.path.getsize(w["path"]), w["size"], w["memdir"]))
        except (ValueError, OSError):   # a marker being written
            return None
    return writes


def main():
    os.environ["ZCKPT_LIBRARY"] = sys.argv[1]
    background = "--background" in sys.argv[2:]
    bg = ["--background"] if background else []
    import zckpt
    import zckpt.hf as zh
    failures = []

    def fail(msg):
        failures.append(msg)
        print("FAIL", msg)

    keep = os.environ.get("ZCK_KEEP_TMP")
    tmp = tempfile.mkdtemp(prefix="interop_hf_ds_kill.")
    run, work = os.path.join(tmp, "run"), os.path.join(tmp, "work")
    os.makedirs(work)
    try:
        # 1. train, and kill -9 both ranks while checkpoint-2's DeepSpeed save is being written
        log = os.path.join(tmp, "train.log")
        p, port = launch(["train", run, work] + bg, log)
        ckpt2 = os.path.join(run, "checkpoint-2")
        seen, writes, deadline = None, None, time.monotonic() + 300
        while seen is None and p.poll() is None and time.monotonic() < deadline:
            if background:
                writes = background_write_under_way(ckpt2, work)
                if writes is None:
                    time.sleep(0.05)
                    continue
            for st in glob.glob(os.path.join(ckpt2, f".{SLOW_TAG}.zck-tmp-*")):
                files = [f for f in os.listdir(st) if os.path.getsize(os.path.join(st, f)) > 0]
                pids = sorted(glob.glob(os.path.join(work, "pid.train.*")))
                if files and len(pids) == WORLD:
                    seen = (os.path.basename(st), sorted(files), [int(open(x).read()) for x in pids])
            time.sleep(0.05)
        if seen is None:
            p.kill()
            p.wait()
            clean_shm(port)
            sys.stdout.write(open(log).read()[-6000:])
            fail("never saw checkpoint-2's save under way through the engine")
            return 1
        staging, files, pids = seen
        tag_there = os.path.exists(os.path.join(ckpt2, SLOW_TAG))
        latest_there = os.path.exists(os.path.join(ckpt2, "latest"))
        trainer_files = os.path.exists(os.path.join(ckpt2, "trainer_state.json"))
        if background:
            writes = background_write_under_way(ckpt2, work)   # again, just before the kill
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        rc = p.wait(timeout=120)
        if background:
            for path, on_disk, size, _ in writes:
                print(f"  at the kill a writer thread had {on_disk} of {size} bytes of {os.path.relpath(path, run)} "
                      "on the disk, and both ranks had begun step 3")
                if not 0 < on_disk < size:
                    fail(f"{path}: {on_disk} of {size} bytes at the kill: not during a write")
            if not trainer_files:
                fail("checkpoint-2 had no trainer_state.json at the kill: the Trainer's save had not finished")
        clean_shm(port)
        text = open(log).read()
        print(f"kill -9 of ranks {pids} while {staging}/ held {files} (tag folder there: {tag_there}, "
              f"latest there: {latest_there}); the launcher exited {rc}")
        if tag_there or latest_there:
            fail("the kill did not come during the save: checkpoint-2 already had its tag folder or latest")
        if rc == 0 or "exitcode  : -9" not in text:
            fail(f"the run was not killed by signal 9 (launcher rc {rc})")
        killed = losses(os.path.join(work, "losses.train.jsonl"))
        if sorted(killed) != [1, 2]:
            fail(f"the killed run logged steps {sorted(killed)}, want [1, 2]")

        # 2. what is left: checkpoint-1 complete and clean, checkpoint-2 not
        if zh.is_complete(ckpt2):
            fail("checkpoint-2 is taken for complete after the kill")
        picked = zh.last_complete_checkpoint(run)
        if picked != os.path.join(run, "checkpoint-1"):
            fail(f"last_complete_checkpoint after the kill: {picked}")
            return 1
        rep = zckpt.verify(picked)
        if not rep.clean or rep.manifest is None:
            fail(f"{picked}: verify {rep.result}, manifest {rep.manifest}")

        # 3. resume from it
        log = os.path.join(tmp, "resume.log")
        p, port = launch(["resume", run, work, picked] + bg, log)
        rc = p.wait(timeout=600)
        clean_shm(port)
        if rc != 0:
            sys.stdout.write(open(log).read()[-6000:])
            fail("the resume from checkpoint-1 failed")
            return 1
        resumed = losses(os.path.join(work, "losses.resume.jsonl"))
        if sorted(resumed) != [2, 3]:
            fail(f"the resume logged steps {sorted(resumed)}, want [2, 3]")
        elif not abs(resumed[2] - killed.get(2, float("nan"))) <= 1e-6 * abs(resumed[2]):
            fail(f"step 2 loss: resumed {resumed[2]!r}, the killed run logged {killed.get(2)!r}")
        else:
            print(f"resumed from checkpoint-1: step 2 loss {resumed[2]!r} = the killed run's {killed[2]!r}")
        for n in (2, 3):
            ckpt = os.path.join(run, f"checkpoint-{n}")
            rep = zckpt.verify(ckpt)
            if not zh.is_complete(ckpt) or not rep.clean or rep.manifest is None:
                fail(f"{ckpt} after the resume: complete {zh.is_complete(ckpt)}, verify {rep.result}")
            left = [f for f in os.listdir(ckpt) if "zck-tmp" in f]
            if left:
                fail(f"{ckpt}: left {left}")
        if zh.last_complete_checkpoint(run) != os.path.join(run, "checkpoint-3"):
            fail(f"last_complete_checkpoint after the resume: {zh.last_complete_checkpoint(run)}")
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        n = len(get_fp32_state_dict_from_zero_checkpoint(os.path.join(run, "checkpoint-3")))
        print(f"checkpoint-2 and -3 of the resume: complete, verify clean; DeepSpeed's zero_to_fp32 reads {n} "
              "tensors from checkpoint-3")
        if background:
            # consolidated after the commit: checkpoint-2's at step 3's end, checkpoint-3's when training ended
            for n in (2, 3):
                ckpt = os.path.join(run, f"checkpoint-{n}")
                check_zero_to_fp32(ckpt, os.path.join(ckpt, "consolidated", "model.safetensors"), fail)
            print("checkpoint-2/consolidated and checkpoint-3/consolidated = DeepSpeed's zero_to_fp32 bit for bit")
        for _, _, _, memdir in writes or []:
            if os.path.exists(memdir):   # the killed process's snapshots in memory: the resume's engine sweeps them
                fail(f"{memdir}: the killed run's in-memory snapshots are still there")
    finally:
        if keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("PASS" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("train", "resume"):
        a = [x for x in sys.argv[1:] if x != "--background"]
        worker(a[0], a[1], a[2], a[3] if len(a) > 3 else None, "--background" in sys.argv)
        end_worker()
    else:
        sys.exit(main())
