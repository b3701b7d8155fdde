"""interop_hf_peft.py: DeepSpeed loads what `zckpt reshard` writes from HF Trainer + PEFT (LoRA) checkpoints.

For every case of tests/fixtures/hf_peft/ (saved by the real HF Trainer with exclude_frozen_parameters; see
tests/fixtures/gen/make_hf_peft_fixtures.py) and its target (TARGETS: stages 1-3, world sizes 1 and 2):
`zckpt reshard --to-stage S --to-world-size W`, then W processes build the same PEFT model, a fresh DeepSpeed
engine at (S, W) and call engine.load_checkpoint(out, load_module_strict=False) (as the Trainer does for PEFT
models). Checks on every rank, per trainable (LoRA) param, gathered with DeepSpeed's own safe_get_full_* API:
  fp32 master            == DeepSpeed's zero_to_fp32 of the source (sha256 in expected.json)
  exp_avg, exp_avg_sq    == DeepSpeed's ds_to_universal.py of the source (sha256 in expected.json)
and that the resharded files keep the unsaved tied alias in shared_params. One target goes through the HDF5
container instead (`to-universal --format hdf5`, then reshard from it).
Prints `N passed, M failed`; exit 0 only if all pass (77 without zckpt or fixtures).
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
GEN = os.path.join(SRC, "tests", "fixtures", "gen")
FIX = os.path.join(os.environ.get("ZCK_FIXTURES") or os.path.join(SRC, "tests", "fixtures"), "hf_peft")
sys.path.insert(0, GEN)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
ZCKPT = os.environ.get("ZCK_BIN") or os.path.join(SRC, "build", "bin", "zckpt")
# (stage, world size) targets per case: every target stage and both directions between stages 2 and 3 over the
# four cases, kept to one DeepSpeed load each (a load costs about a minute of CPU here)
TARGETS = {"s2w2_lora_tied_bf16": [(3, 2)], "s3w2_lora_tied_bf16": [(2, 1)], "s2w2_lora_untied_fp32": [(1, 1)],
           "s3w2_lora_untied_fp32": [(3, 1)]}
# and through the HDF5 container (`to-universal --format hdf5`, then reshard from it): one load; tests/reshard's
# test_reshard_universal checks every target of every case byte for byte against the reshard of the source
H5_TARGETS = {"s3w2_lora_tied_bf16": [(3, 2)]}


def sha(t):
    import torch
    return hashlib.sha256(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def worker(spec_path):
    import torch
    import torch.distributed as dist
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    import make_hf_peft_fixtures as g
    with open(spec_path) as f:
        spec = json.load(f)
    deepspeed.init_distributed(dist_backend="gloo")
    model = g.build_peft_model(spec["tied"])
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "torch_adam": True}},
           "zero_optimization": {"stage": spec["stage"]}, "bf16": {"enabled": spec["dtype"] == "bf16"},
           "steps_per_print": 10**6}
    params = [p for p in model.parameters() if p.requires_grad]
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=cfg)
    path, _ = engine.load_checkpoint(spec["load_dir"], load_module_strict=False)
    if path is None:
        raise RuntimeError("load_checkpoint returned None")
    if hasattr(opt, "_lazy_init_hp_params_optimizer_state") and opt.optimizer.state:
        opt._hp_optimizer_states_linked = False      # link the optimizer-state fragments now (see ds_harness.py)
        opt._lazy_init_hp_params_optimizer_state()
    out = {}
    for n, p in engine.module.named_parameters():
        if p.requires_grad:
            out[n] = {"fp32": sha(safe_get_full_fp32_param(p)),
                      "exp_avg": sha(safe_get_full_optimizer_state(p, "exp_avg")),
                      "exp_avg_sq": sha(safe_get_full_optimizer_state(p, "exp_avg_sq"))}
    with open(spec["out"] + f".rank{dist.get_rank()}.json", "w") as f:
        json.dump(out, f)
    dist.barrier()


def scenario(case, exp, stage, world, tmp, via_h5=False):
    from ds_launch import launch
    src = os.path.join(FIX, case, "ckpt")
    out = os.path.join(tmp, f"{case}-s{stage}w{world}" + ("-h5" if via_h5 else ""))
    if via_h5:
        h5 = os.path.join(tmp, f"{case}.h5")
        r = subprocess.run([ZCKPT, "to-universal", "-q", "--format", "hdf5", src, h5], capture_output=True, text=True)
        if r.returncode:
            return [f"zckpt to-universal --format hdf5 failed: {r.stderr.strip()}"]
        src = h5
    r = subprocess.run([ZCKPT, "reshard", "-q", src, out, "--to-stage", str(stage), "--to-world-size", str(world)],
                       capture_output=True, text=True)
    if r.returncode:
        return [f"zckpt reshard failed: {r.stderr.strip()}"]
    probs = []
    import torch
    tag = open(os.path.join(out, "latest")).read().strip()
    mf = "zero_pp_rank_0_mp_rank_00_model_states.pt" if stage == 3 else "mp_rank_00_model_states.pt"
    shared = torch.load(os.path.join(out, tag, mf), map_location="cpu", weights_only=False)["shared_params"]
    if shared != exp["model_states"]["shared_params"]:
        probs.append(f"shared_params {shared} != source's {exp['model_states']['shared_params']}")
    spec = {"tied": exp["tied_head"], "stage": stage, "dtype": exp["dtype"], "load_dir": out,
            "out": os.path.join(tmp, f"res-{case}-s{stage}w{world}" + ("-h5" if via_h5 else ""))}
    sp = spec["out"] + ".spec.json"
    with open(sp, "w") as f:
        json.dump(spec, f)
    rc = launch(world, [os.path.abspath(__file__), "--worker", sp], log_prefix=spec["out"], timeout=900)
    if rc:
        with open(spec["out"] + ".rank0.log") as f:
            return probs + ["DeepSpeed load failed: " + "".join(f.readlines()[-8:])]
    z2f = exp["zero_to_fp32"]["tensors"]
    uni = exp["ds_to_universal"]["files"]
    for r_ in range(world):
        with open(spec["out"] + f".rank{r_}.json") as f:
            got = json.load(f)
        if sorted(got) != sorted(exp["trainable"]):
            probs.append(f"rank {r_}: trainable params differ")
            continue
        for n, h in got.items():
            if h["fp32"] != z2f[n]["sha256"]:
                probs.append(f"rank {r_}: {n}: fp32 master differs from zero_to_fp32's")
            for k in ("exp_avg", "exp_avg_sq"):
                if h[k] != uni[f"zero/{n}/{k}.pt"]["sha256"]:
                    probs.append(f"rank {r_}: {n}: {k} differs from ds_to_universal's")
    return probs


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        from ds_launch import end_worker
        end_worker()
    if not os.path.exists(ZCKPT) or not os.path.isdir(FIX):
        print("SKIP: no zckpt binary or no hf_peft fixtures")
        sys.exit(77)
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="zckpt_peft_") as tmp:
        for case in sorted(os.listdir(FIX)):
            ep = os.path.join(FIX, case, "expected.json")
            if not os.path.exists(ep):
                continue
            with open(ep) as f:
                exp = json.load(f)
            runs = [(s, w, False) for s, w in TARGETS.get(case, [(2, 1)])]
            runs += [(s, w, True) for s, w in H5_TARGETS.get(case, [])]
            for stage, world, via_h5 in runs:
                probs = scenario(case, exp, stage, world, tmp, via_h5)
                name = f"{case}{' -> universal.h5' if via_h5 else ''} -> stage {stage}, W={world}"
                print(("FAIL " if probs else "ok   ") + name, flush=True)
                for p in probs[:10]:
                    print("     " + p)
                passed += not probs
                failed += bool(probs)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed or not passed else 0)


if __name__ == "__main__":
    main()
