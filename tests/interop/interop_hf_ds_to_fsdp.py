"""interop_hf_ds_to_fsdp.py LIBZCKPT ZCKPT: an HF Trainer + DeepSpeed ZeRO-3 run goes on under the HF Trainer's
FSDP2 from `zckpt reshard checkpoint-N OUT --to-format dcp-accelerate` (torchrun, gloo, the CPU).

1. DeepSpeed: the tiny tied Llama of tests/fixtures/gen/make_dcp_fixtures.py, W=2, ZeRO-3, fp32, the Trainer's
   own AdamW (two param groups: weight decay 0.1 and 0.0) and linear lr schedule, 4 steps, a checkpoint at steps
   2 and 4. At the save of step 2 every rank asks DeepSpeed for the full fp32 weights, exp_avg and exp_avg_sq of
   each parameter (deepspeed.utils.safe_get_full_*: DeepSpeed's view, not zckpt's) and the optimizer's step and
   group settings: the reference.
2. `zckpt reshard run/checkpoint-2 fsdp/checkpoint-2 --to-format dcp-accelerate`: pytorch_model_fsdp_0/ and
   optimizer_0/ as the Trainer saves an FSDP model, with the DeepSpeed checkpoint-N's other files carried over
   (trainer_state.json: the global step and data position; scheduler.pt; rng_state_<r>.pth).
3. FSDP2: the HF Trainer with fsdp (version 2, SHARDED_STATE_DICT), W=2, the same arguments,
   trainer.train(resume_from_checkpoint=fsdp/checkpoint-2) to step 4. Checks, at on_train_begin (after the
   Trainer's load, before any step), through torch's get_state_dict(full_state_dict=True):
   - every weight, exp_avg and exp_avg_sq = DeepSpeed's at step 2, bit for bit; Adam's step = 2 for every
     parameter; each group's lr, betas, eps and weight_decay = DeepSpeed's;
   - the resume starts at global step 2 with the scheduler's last lr = DeepSpeed's lr;
   - step 3's loss = the uninterrupted DeepSpeed run's bit for bit (it depends on the weights and the data
     position only); step 4's within 1e-5 relative (it also depends on the Adam moments, step and lr carried
     over; the gradients are reduced by FSDP instead of ZeRO-3, in another order).
Exit 0 when everything holds, 1 otherwise, 77 without the packages.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "fixtures", "gen"))
sys.path.insert(0, os.path.join(SRC, "python"))
sys.path.insert(0, HERE)
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from ds_launch import end_worker, torchrun  # noqa: E402

WORLD, STAGE, STEPS, SAVED = 2, 3, 4, 2


def training_args(out_dir, **kw):
    from make_dcp_fixtures import BATCH
    from transformers import TrainingArguments
    return TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=BATCH, gradient_accumulation_steps=1, max_steps=STEPS,
        save_strategy="steps", save_steps=SAVED, learning_rate=1e-2, weight_decay=0.1, warmup_steps=0,
        lr_scheduler_type="linear", logging_steps=1, report_to=[], seed=42, data_seed=42, use_cpu=False,
        dataloader_num_workers=0, disable_tqdm=True, **kw)


def dataset():
    import torch
    from make_dcp_fixtures import SEQ, VOCAB

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            ids = torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(500 + i))
            return {"input_ids": ids, "labels": ids.clone()}
    return Data()


def settings(group):
    return {k: list(v) if isinstance(v, tuple) else v for k, v in group.items()
            if k in ("lr", "betas", "eps", "weight_decay")}


def log_losses(path):
    from transformers import TrainerCallback

    class Losses(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs and "loss" in logs:
                with open(path, "a") as f:
                    f.write(json.dumps({"step": state.global_step, "loss": logs["loss"]}) + "\n")
    return Losses()


def ds_worker(run_dir, work):
    import torch
    from make_dcp_fixtures import build_model
    from make_hf_peft_fixtures import patch_for_cpu
    patch_for_cpu()
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    from transformers import Trainer, TrainerCallback

    # no "optimizer" block: the Trainer makes its own AdamW (torch's), two groups, as under FSDP
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "train_batch_size": "auto", "gradient_clipping": 1.0, "zero_optimization": {"stage": STAGE},
          "bf16": {"enabled": False}, "steps_per_print": 1000}
    trainer = None

    class Reference(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step != SAVED:
                return
            engine = trainer.model_wrapped
            ref = {"params": {}, "groups": [settings(g) for g in engine.optimizer.optimizer.param_groups],
                   "steps": sorted({float(s["step"]) for s in engine.optimizer.optimizer.state.values()}),
                   "lr": trainer.lr_scheduler.get_last_lr()}
            for name, p in engine.module.named_parameters():   # every rank: the gathers are collective
                ref["params"][name] = {"weight": safe_get_full_fp32_param(p).clone(),
                                       "exp_avg": safe_get_full_optimizer_state(p, "exp_avg").clone(),
                                       "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq").clone()}
            if state.is_world_process_zero:
                torch.save(ref, os.path.join(work, "reference.pt"))

    trainer = Trainer(model=build_model(True, "fp32"), args=training_args(run_dir, deepspeed=ds),
                      train_dataset=dataset(), callbacks=[Reference(), log_losses(os.path.join(work, "losses.ds"))])
    trainer.train()


def fsdp_worker(run_dir, work, resume_from):
    import torch
    from make_dcp_fixtures import build_model, use_fsdp_on_cpu
    from make_hf_peft_fixtures import patch_for_cpu
    patch_for_cpu()
    use_fsdp_on_cpu()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from transformers import Trainer, TrainerCallback
    trainer = None

    class AfterLoad(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            opt = trainer.optimizer.optimizer   # accelerate's wrapper around torch's AdamW
            msd, osd = get_state_dict(trainer.model_wrapped, opt,
                                      options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if state.is_world_process_zero:
                torch.save({"model": msd, "optim": osd, "global_step": state.global_step,
                            "lr": trainer.lr_scheduler.get_last_lr(), "wrapped": type(trainer.model_wrapped).__name__},
                           os.path.join(work, "after_load.pt"))

    args = training_args(run_dir, fsdp=True, fsdp_config={"version": 2, "state_dict_type": "SHARDED_STATE_DICT",
                                                          "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
    trainer = Trainer(model=build_model(True, "fp32"), args=args, train_dataset=dataset(),
                      callbacks=[AfterLoad(), log_losses(os.path.join(work, "losses.fsdp"))])
    assert trainer.is_fsdp_enabled
    trainer.train(resume_from_checkpoint=resume_from)


def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path))} if os.path.exists(path) else {}


def main():
    os.environ["ZCKPT_LIBRARY"] = sys.argv[1]
    zckpt_bin = sys.argv[2]
    import torch
    failures = []

    def fail(msg):
        failures.append(msg)
        print("FAIL", msg)

    def same_bits(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
            a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))

    keep = os.environ.get("ZCK_KEEP_TMP")
    tmp = tempfile.mkdtemp(prefix="interop_hf_ds_to_fsdp.")
    run, work, fsdp = (os.path.join(tmp, x) for x in ("run", "work", "fsdp"))
    os.makedirs(work)
    try:
        if torchrun(WORLD, __file__, ["ds", run, work], os.path.join(tmp, "ds.log")):
            fail(f"the DeepSpeed ZeRO-{STAGE} Trainer run at W={WORLD} failed")
            return 1
        src, out = os.path.join(run, f"checkpoint-{SAVED}"), os.path.join(fsdp, f"checkpoint-{SAVED}")
        r = subprocess.run([zckpt_bin, "reshard", "-q", src, out, "--to-format", "dcp-accelerate"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"zckpt reshard --to-format dcp-accelerate: exit {r.returncode}: {r.stderr.strip()}")
            return 1
        have = sorted(os.listdir(out))
        print(f"zckpt reshard {os.path.basename(src)} --to-format dcp-accelerate: {have}")
        for f in ("pytorch_model_fsdp_0", "optimizer_0", "trainer_state.json", "scheduler.pt",
                  "rng_state_0.pth", "rng_state_1.pth", "zckpt-manifest.json"):
            if f not in have:
                fail(f"{out}: no {f}")
        for f in ("latest", f"global_step{SAVED}", "zero_to_fp32.py"):   # DeepSpeed's, not an FSDP checkpoint's
            if f in have:
                fail(f"{out}: {f} carried over")
        if torchrun(WORLD, __file__, ["fsdp", fsdp, work, out], os.path.join(tmp, "fsdp.log")):
            fail(f"the FSDP2 Trainer resume at W={WORLD} from {out} failed")
            return 1

        ref = torch.load(os.path.join(work, "reference.pt"), weights_only=False)
        got = torch.load(os.path.join(work, "after_load.pt"), weights_only=False)
        print(f"resumed under {got['wrapped']} at global step {got['global_step']}")
        if got["global_step"] != SAVED:
            fail(f"the resume starts at global step {got['global_step']}, want {SAVED}")
        if got["lr"] != ref["lr"]:
            fail(f"the scheduler's last lr after the resume {got['lr']} != DeepSpeed's {ref['lr']}")
        osd = got["optim"]
        n = 0
        for name, r_ in ref["params"].items():
            if name not in got["model"]:
                fail(f"{name}: not in the FSDP model")
                continue
            if not same_bits(got["model"][name], r_["weight"]):
                fail(f"{name}: weight differs from DeepSpeed's after the load")
            st = osd["state"].get(name)
            if st is None:
                fail(f"{name}: no Adam state under FSDP after the load")
                continue
            for k in ("exp_avg", "exp_avg_sq"):
                if not same_bits(st[k], r_[k]):
                    fail(f"{name}: {k} differs from DeepSpeed's after the load")
            if float(st["step"]) != ref["steps"][0] or len(ref["steps"]) != 1:
                fail(f"{name}: Adam step {float(st['step'])}, DeepSpeed's {ref['steps']}")
            n += 1
        groups = [settings(g) for g in osd["param_groups"]]
        if groups != ref["groups"]:
            fail(f"param groups after the load {groups} != DeepSpeed's {ref['groups']}")
        print(f"{n} parameters: weights, exp_avg, exp_avg_sq = DeepSpeed's bit for bit, step {ref['steps']}, "
              f"groups {groups}")

        ds_l, fsdp_l = losses(os.path.join(work, "losses.ds")), losses(os.path.join(work, "losses.fsdp"))
        print(f"losses: DeepSpeed uninterrupted {ds_l}, FSDP resumed {fsdp_l}")
        if sorted(fsdp_l) != [3, 4] or sorted(ds_l) != [1, 2, 3, 4]:
            fail(f"logged steps: DeepSpeed {sorted(ds_l)}, FSDP {sorted(fsdp_l)}")
        else:
            if fsdp_l[3] != ds_l[3]:
                fail(f"step 3 loss: FSDP resumed {fsdp_l[3]!r} != DeepSpeed {ds_l[3]!r}")
            if not abs(fsdp_l[4] - ds_l[4]) <= 1e-5 * abs(ds_l[4]):
                fail(f"step 4 loss: FSDP resumed {fsdp_l[4]!r}, DeepSpeed {ds_l[4]!r}")
    finally:
        if keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("PASS" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("ds", "fsdp"):
        if sys.argv[1] == "ds":
            ds_worker(sys.argv[2], sys.argv[3])
        else:
            fsdp_worker(sys.argv[2], sys.argv[3], sys.argv[4])
        end_worker()
    else:
        sys.exit(main())
