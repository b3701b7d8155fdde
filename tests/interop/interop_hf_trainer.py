"""interop_hf_trainer.py LIBZCKPT: zckpt.hf with the real HF Trainer + DeepSpeed on the CPU (torchrun, gloo).

A tiny GPT-2 (random init from a config, no download, dropout 0, fp32) trains with a global batch of 6 samples
per step (W x per-device batch: 3 x 2 or 2 x 3), on the CPU over gloo.

1. Save: W=3, ZeRO-3 (no stage3_gather_16bit_weights_on_model_save), 4 steps, a checkpoint and an evaluation
   after each, with ZckptCallback(("every", "best")). Checks:
   - each checkpoint-N has zckpt-manifest.json in its tag folder, zckpt.verify says clean against it, and
     is_complete / last_complete_checkpoint agree (a copy without the manifest is not complete);
   - checkpoint-N/consolidated/model.safetensors equals DeepSpeed's zero_to_fp32 of checkpoint-N bit for bit
     (tied lm_head recorded as an alias), with config.json beside it;
   - best_model/ is the consolidation of state.best_model_checkpoint (greater_is_better=True on eval_loss makes
     the best checkpoint the first one, not the last, so "best" is not mistaken for "last").
2. Resume from checkpoint-2 to step 4:
   - the reference: W=3 ZeRO-3 (in the save's launch, after its training); prepare_resume must return
     checkpoint-2 as is;
   - W=2 ZeRO-2 through prepare_resume(checkpoint-2, zero_stage=2), which reshards it (called before the
     process group exists: file-based wait; and after: broadcast; both must give the same folder).
   Why this reference: it resumes the very bytes the reshard reads, at the layout they were saved in, and sees
   the same 6 samples per step (W x per-device batch is fixed), so any difference comes from the reshard and
   the world size alone. A run trained at W=2 ZeRO-2 from step 0 would differ by the rounding of 2 steps done
   in another reduction order, which could hide a small reshard error. The uninterrupted W=3 run's losses are
   checked against the reference too (measured: bit-equal), which shows that the reference itself is sound.
   Step 3's loss depends on the weights only: within 1e-6 relative (measured: equal). Step 4's loss also
   depends on the Adam moments, step count and scheduler the reshard carried: within 1e-5 relative (measured:
   1.1e-7, one float32 ulp; the step-3 gradients are reduced in another order at W=2).
Exit 0 when everything holds, 1 otherwise, 77 without the packages.
"""
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "fixtures", "gen"))
sys.path.insert(0, os.path.join(SRC, "python"))
from ds_launch import end_worker, free_port, torchrun  # noqa: E402,F401  (re-exported to the Trainer tests)
os.environ.setdefault("DS_ACCELERATOR", "cpu")

VOCAB, SEQ, GLOBAL_BATCH = 96, 16, 6


def build_model():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(1234)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def dataset(n):
    import torch

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(7000 + i)
            ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
            return {"input_ids": ids, "labels": ids.clone()}
    return Data()


def ds_config(stage):
    return {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto", "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                       "weight_decay": "auto", "torch_adam": True}},
            "zero_optimization": {"stage": stage}, "bf16": {"enabled": False}, "steps_per_print": 1000}


def worker(mode, stage, out_dir, result_path, resume_from=None):
    import torch
    from make_hf_peft_fixtures import patch_for_cpu
    import zckpt.hf as zh
    patch_for_cpu()
    from transformers import Trainer, TrainingArguments
    world = int(os.environ["WORLD_SIZE"])
    result = {}
    if mode == "resume":
        # before the process group exists: rank 0 works, the others wait for its decision file
        result["early"] = zh.prepare_resume(resume_from, zero_stage=stage)
    common = dict(output_dir=out_dir, per_device_train_batch_size=GLOBAL_BATCH // world,
                  per_device_eval_batch_size=GLOBAL_BATCH // world, gradient_accumulation_steps=1,
                  learning_rate=3e-3, weight_decay=0.1, warmup_steps=0, lr_scheduler_type="linear", logging_steps=1,
                  report_to=[], seed=42, data_seed=42, use_cpu=False, deepspeed=ds_config(stage),
                  dataloader_num_workers=0, disable_tqdm=True)
    if mode == "save":
        args = TrainingArguments(max_steps=4, save_strategy="steps", save_steps=1, eval_strategy="steps",
                                 eval_steps=1, metric_for_best_model="eval_loss", greater_is_better=True, **common)
        trainer = Trainer(model=build_model(), args=args, train_dataset=dataset(48), eval_dataset=dataset(6),
                          callbacks=[zh.ZckptCallback(("every", "best"))])
        trainer.train()
        result["best_model_checkpoint"] = trainer.state.best_model_checkpoint
        result["log_history"] = trainer.state.log_history
        # the reference resume, in the same processes (one launch less): W=3 ZeRO-3 from checkpoint-2, which
        # prepare_resume must return as is
        resume_from = os.path.join(out_dir, "checkpoint-2")
        common["output_dir"] = out_dir + "-resumed"
    args = TrainingArguments(max_steps=4, save_strategy="no", **common)
    path = zh.prepare_resume(resume_from, zero_stage=stage)  # process group up: broadcast over gloo
    result["resume_path"] = path
    trainer = Trainer(model=build_model(), args=args, train_dataset=dataset(48))
    trainer.train(resume_from_checkpoint=path)
    result["resumed_log_history"] = trainer.state.log_history
    if torch.distributed.get_rank() == 0:
        with open(result_path, "w") as f:
            json.dump(result, f)
    torch.distributed.barrier()


def same_bits(a, b):
    import torch
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def check_consolidated(ckpt, out, fail):
    f = os.path.join(out, "model.safetensors")
    n = check_zero_to_fp32(ckpt, f, fail)
    if not os.path.isfile(os.path.join(out, "config.json")):
        fail(f"{out}: no config.json")
    return n


def check_zero_to_fp32(ckpt, f, fail):
    """The safetensors file f equals DeepSpeed's zero_to_fp32 of ckpt bit for bit, an alias recorded as tied."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors import safe_open
    from safetensors.torch import load_file
    ref = get_fp32_state_dict_from_zero_checkpoint(ckpt)
    if not os.path.isfile(f):
        return fail(f"{f}: missing")
    ours = load_file(f)
    with safe_open(f, "pt") as h:
        tied = json.loads((h.metadata() or {}).get("tied_parameters", "{}"))
    first = {}
    for name, t in ref.items():
        first.setdefault(t.data_ptr(), name)
    for name, t in ref.items():
        if first[t.data_ptr()] != name:
            if name in ours or tied.get(name) != first[t.data_ptr()]:
                fail(f"{f}: alias {name} -> {first[t.data_ptr()]} not recorded as tied")
        elif name not in ours or not same_bits(ours[name], t):
            fail(f"{f}: {name} differs from zero_to_fp32")
    if set(ours) - set(ref):
        fail(f"{f}: extra tensors {sorted(set(ours) - set(ref))}")
    return len(ours)


def main():
    os.environ["ZCKPT_LIBRARY"] = sys.argv[1]
    import zckpt
    import zckpt.hf as zh
    failures = []

    def fail(msg):
        failures.append(msg)
        print("FAIL", msg)

    keep = os.environ.get("ZCK_KEEP_TMP")
    tmp = tempfile.mkdtemp(prefix="interop_hf_trainer.")
    try:
        run = os.path.join(tmp, "run")
        if torchrun(3, __file__, ["save", "3", run, os.path.join(tmp, "save.json")], os.path.join(tmp, "save.log")):
            fail("W=3 ZeRO-3 training with ZckptCallback failed")
            return 1
        with open(os.path.join(tmp, "save.json")) as f:
            saved = json.load(f)
        # 1. manifests, consolidation, best
        for n in (1, 2, 3, 4):
            ckpt = os.path.join(run, f"checkpoint-{n}")
            manifest = os.path.join(ckpt, f"global_step{n}", "zckpt-manifest.json")
            if not os.path.isfile(manifest):
                fail(f"{manifest}: missing")
                continue
            rep = zckpt.verify(ckpt)
            if not rep.clean or rep.manifest is None or rep.tensors == 0:
                fail(f"{ckpt}: verify {rep.result}, manifest {rep.manifest}, {rep.tensors} tensors checked: "
                     + "; ".join(x.message for x in rep.findings))
            if not zh.is_complete(ckpt):
                fail(f"{ckpt}: not complete")
            check_consolidated(ckpt, os.path.join(ckpt, "consolidated"), fail)
        if zh.last_complete_checkpoint(run) != os.path.join(run, "checkpoint-4"):
            fail(f"last_complete_checkpoint: {zh.last_complete_checkpoint(run)}")
        torn = os.path.join(tmp, "torn", "checkpoint-3")
        shutil.copytree(os.path.join(run, "checkpoint-2"), torn)
        os.unlink(os.path.join(torn, "global_step2", "zckpt-manifest.json"))
        shutil.copytree(os.path.join(run, "checkpoint-1"), os.path.join(tmp, "torn", "checkpoint-1"))
        if zh.is_complete(torn) or zh.last_complete_checkpoint(os.path.dirname(torn)) != os.path.join(
                tmp, "torn", "checkpoint-1"):
            fail("a checkpoint without its manifest is taken for complete")
        best = saved["best_model_checkpoint"]
        if not best or os.path.basename(best) != "checkpoint-1":
            fail(f"best_model_checkpoint {best}: the test wants checkpoint-1 (the first eval loss is the greatest)")
        else:
            check_consolidated(best, os.path.join(run, "best_model"), fail)

        # 2. resume from checkpoint-2: the reference at W=3 ZeRO-3 (same launch as the save), then W=2 ZeRO-2
        ckpt = os.path.join(run, "checkpoint-2")
        if saved["resume_path"] != ckpt:
            fail(f"prepare_resume changed a checkpoint whose layout the run has: {saved['resume_path']}")
        res = os.path.join(tmp, "resume.json")
        if torchrun(2, __file__, ["resume", "2", os.path.join(tmp, "resume-w2z2"), res, ckpt], os.path.join(tmp, "resume.log")):
            fail("W=2 ZeRO-2 resume through prepare_resume failed")
            return 1
        with open(res) as f:
            r = json.load(f)
        path = r["resume_path"]
        if r["early"] != path:
            fail(f"prepare_resume before the process group gave {r['early']}, after it {path}")
        if not os.path.basename(path).startswith("resharded-checkpoint-2-w2-zero2-") or \
                os.path.dirname(path) != os.path.abspath(run):
            fail(f"prepare_resume gave {path}")
        else:
            info = zckpt.inspect(path)
            if (info["world_size"], info["stage"]) != (2, 2):
                fail(f"{path}: W={info['world_size']} ZeRO-{info['stage']}, want W=2 ZeRO-2")
            for f in ("trainer_state.json", "rng_state_0.pth", "rng_state_1.pth", "config.json"):
                if not os.path.isfile(os.path.join(path, f)):
                    fail(f"{path}: {f} not carried over")
            if os.path.exists(os.path.join(path, "rng_state_2.pth")):
                fail(f"{path}: rng_state_2.pth carried to a 2-rank run")

        def steps(history):
            return {h["step"]: h["loss"] for h in history if "loss" in h and h["step"] > 2}
        runs = {"W=3 ZeRO-3 uninterrupted": steps(saved["log_history"]),
                "W=3 ZeRO-3 resumed (reference)": steps(saved["resumed_log_history"]),
                "W=2 ZeRO-2 resumed through prepare_resume": steps(r["resumed_log_history"])}
        ref = runs["W=3 ZeRO-3 resumed (reference)"]
        for name, got in runs.items():
            if sorted(got) != [3, 4]:
                fail(f"{name}: logged steps {sorted(got)}, want [3, 4]")
                continue
            for step, tol in ((3, 1e-6), (4, 1e-5)):
                rel = abs(got[step] - ref.get(step, float("nan"))) / abs(ref.get(step, float("nan")))
                print(f"step {step}: loss {got[step]!r} {name}: {rel:.2e} relative to the reference (limit {tol:.0e})")
                if not rel <= tol:
                    fail(f"{name}: step {step} loss differs from the reference by {rel:.2e} relative")
    finally:
        if keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("PASS" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("save", "resume"):
        worker(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
        end_worker()
    else:
        sys.exit(main())
