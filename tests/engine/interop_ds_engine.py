"""interop_ds_engine.py LIBZCKPT: zckpt.ds_engine with real DeepSpeed 0.19 (2 CPU ranks, gloo).

For ZeRO 2 and 3 (a small transformers GPT2LMHeadModel, torch AdamW, 2 steps):
  - engine.save_checkpoint(A) with DeepSpeed's own TorchCheckpointEngine, then
    zckpt.ds_engine.install(engine) and engine.save_checkpoint(B) of the same state: B's tag
    folder holds the same files with the same bytes as A's, plus zckpt-manifest.json;
    `zckpt verify` finds B clean; `latest` names the tag; no staging folder is left;
  - the same tag saved again replaces the folder whole; a step later a second tag commits
    and `latest` moves to it;
  - install(engine, background=True): a save of the same state writes the same files from a
    thread; the tag folder and `latest` appear only at the next optimizer step's commit;
  - kill -9 of rank 1 in the middle of a third save, a background one (in its writer thread,
    after its first file): the run dies,
    B's `latest` still names the second tag, whose folder verifies clean, and the dead
    save's files are only in its staging folder; a new DeepSpeed run loads B
    (load_checkpoint) at that step, with install_default() in force, trains on and saves
    global_step4 through the engine DeepSpeed made (verify clean, `latest` on it, the dead
    save's staging folder swept).
Exit 77 without torch/transformers/deepspeed.
"""
import os
import sys
import tempfile

try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import deepspeed  # noqa: F401
except Exception as e:  # noqa: BLE001
    print(f"SKIP: needs torch, transformers and deepspeed ({e})", file=sys.stderr)
    sys.exit(77)

RANK_SCRIPT = r'''
import os, sys, torch, deepspeed, transformers
sys.path.insert(0, sys.argv[1])
import zckpt, zckpt.ds_engine
mode, out = sys.argv[2], sys.argv[3]
deepspeed.init_distributed(dist_backend="gloo")
rank = torch.distributed.get_rank()

def make(stage):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=32,
                                                                 n_layer=2, n_head=4))
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                      config=cfg)
    return engine

def step(engine, k):
    g = torch.Generator().manual_seed(100 + k * 2 + rank)
    x = torch.randint(0, 256, (2, 16), generator=g)
    loss = engine(x, labels=x).loss
    engine.backward(loss)
    engine.step()

def same_tree(a, b):
    fa = sorted(f for f in os.listdir(a) if f != "zckpt-manifest.json")
    fb = sorted(f for f in os.listdir(b) if f != "zckpt-manifest.json")
    assert fa == fb, (fa, fb)
    for f in fa:
        assert open(os.path.join(a, f), "rb").read() == open(os.path.join(b, f), "rb").read(), f"{f} differs"
    return len(fa)

for stage in (2, 3):
    A, B = os.path.join(out, f"z{stage}", "torch"), os.path.join(out, f"z{stage}", "zckpt")
    if mode == "save":
        engine = make(stage)
        for k in range(2):
            step(engine, k)
        engine.save_checkpoint(A, tag="global_step2")
        zckpt.ds_engine.install(engine)
        engine.save_checkpoint(B, tag="global_step2")
        if rank == 0:
            n = same_tree(os.path.join(A, "global_step2"), os.path.join(B, "global_step2"))
            assert open(os.path.join(B, "latest")).read() == "global_step2"
            rep = zckpt.verify(B)
            assert rep.result == "clean" and rep.manifest, (rep.result, rep.manifest, rep.findings[:3])
            print(f"ZeRO-{stage}: {n} files equal to TorchCheckpointEngine's, manifest, verify clean", flush=True)
        engine.save_checkpoint(B, tag="global_step2")  # the same tag again: replaced whole
        step(engine, 2)
        engine.save_checkpoint(B, tag="global_step3")
        if rank == 0:
            assert open(os.path.join(B, "latest")).read() == "global_step3"
            assert zckpt.verify(B).result == "clean"
            left = [f for f in os.listdir(B) if "zck-tmp" in f]
            assert not left, left
        # background: the same state's files, written by a thread, committed (with `latest`)
        # by DeepSpeed's next optimizer step
        C = os.path.join(out, f"z{stage}", "background")
        zckpt.ds_engine.install(engine, background=True)
        engine.save_checkpoint(C, tag="global_step3")
        assert not os.path.exists(os.path.join(C, "global_step3"))  # not before the commit
        torch.distributed.barrier()
        step(engine, 3)
        if rank == 0:
            n = same_tree(os.path.join(B, "global_step3"), os.path.join(C, "global_step3"))
            assert open(os.path.join(C, "latest")).read() == "global_step3"
            assert zckpt.verify(C).result == "clean"
            left = [f for f in os.listdir(C) if "zck-tmp" in f]
            assert not left, left
            print(f"ZeRO-{stage}: background save: {n} files equal, committed at the next step, verify clean", flush=True)
        zckpt.ds_engine.install(engine)  # foreground again
        if stage == 3:  # the third save in the background: rank 1 dies in its writer thread
            zckpt.ds_engine.install(engine, background=True)
        if rank == 1 and stage == 3:
            import shutil
            real = shutil.copyfile
            def copy_then_die(src, dst):
                real(src, dst)
                os.kill(os.getpid(), 9)
            shutil.copyfile = copy_then_die
        if stage == 3:
            engine.save_checkpoint(B, tag="global_step4")
            engine.checkpoint_engine.commit_pending()  # rank 1 dies before this commit
    else:  # resume, through an engine made with install_default() in force
        zckpt.ds_engine.install_default()
        engine = make(stage)
        assert isinstance(engine.checkpoint_engine, zckpt.ds_engine.ZckptCheckpointEngine)
        path, _ = engine.load_checkpoint(B)
        assert path is not None and engine.global_steps == 3, (path, engine.global_steps)
        step(engine, 3)
        assert engine.global_steps == 4
        engine.save_checkpoint(B)
        if rank == 0:
            assert open(os.path.join(B, "latest")).read() == "global_step4"
            assert zckpt.verify(B).result == "clean"
            left = [f for f in os.listdir(B) if "zck-tmp" in f]
            assert not left, f"the killed save's staging folder was not swept: {left}"
            print(f"ZeRO-{stage}: resumed from {B} at step 3, trained on, saved global_step4", flush=True)
torch.distributed.barrier()
sys.stdout.flush()
os._exit(0)
'''


def main():
    lib = sys.argv[1]
    os.environ["ZCKPT_LIBRARY"] = lib
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, "..", "..")
    sys.path.insert(0, os.path.join(src, "tests", "fixtures", "gen"))
    sys.path.insert(0, os.path.join(src, "python"))
    from ds_launch import launch
    import zckpt
    fail = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "rank.py")
        with open(script, "w") as f:
            f.write(RANK_SCRIPT)
        log = os.path.join(tmp, "save")
        rc = launch(2, [script, os.path.join(src, "python"), "save", tmp], log_prefix=log)
        text = open(log + ".rank0.log").read()
        print("\n".join(l for l in text.splitlines() if l.startswith("ZeRO-")))
        if rc == 0:
            fail.append("the run with a rank killed in its save exited 0")
        if text.count("verify clean") != 4:
            print(text[-3000:], file=sys.stderr)
            print(open(log + ".rank1.log").read()[-2000:], file=sys.stderr)
            print("FAIL: the saves did not all check out")
            sys.exit(1)
        B = os.path.join(tmp, "z3", "zckpt")
        latest = open(os.path.join(B, "latest")).read()
        if latest != "global_step3":
            fail.append(f"after the kill, latest names {latest!r}, not global_step3")
        if os.path.exists(os.path.join(B, "global_step4")):
            fail.append("the killed save's tag folder is in place")
        staged = [f for f in os.listdir(B) if f.startswith(".global_step4.zck-tmp-")]
        if not staged:
            fail.append("no staging folder of the killed save (did the kill happen during the save?)")
        if zckpt.verify(B).result != "clean":
            fail.append("the previous tag does not verify clean after the kill")
        print(f"kill -9 of rank 1 during the save of global_step4: latest {latest}, killed save only in {staged}")
        log = os.path.join(tmp, "resume")
        rc = launch(2, [script, os.path.join(src, "python"), "resume", tmp], log_prefix=log)
        text = open(log + ".rank0.log").read()
        print("\n".join(l for l in text.splitlines() if l.startswith("ZeRO-")))
        if rc != 0 or text.count("saved global_step4") != 2:
            print(text[-3000:], file=sys.stderr)
            fail.append("the resume failed")
    for f in fail:
        print("FAIL:", f)
    print("ok" if not fail else f"{len(fail)} failures")
    sys.exit(1 if fail else 0)


if __name__ == "__main__":
    main()
