#!/usr/bin/env python3
"""Loads a DeepSpeed checkpoint into a fresh CPU engine and dumps what it loaded.

    ds_load.py CKPT STAGE WORLD DTYPE EXTRA_JSON OUT_JSON

Launches WORLD ranks (tests/fixtures/gen/ds_launch.py); each builds the fixtures' TinyModel
with the fixtures' config at STAGE / WORLD / DTYPE, calls engine.load_checkpoint(CKPT)
(optimizer and scheduler states included) and rank 0 writes, per trainable param, the
SHA-256 of the full fp32 master, exp_avg and exp_avg_sq (safe_get_full_*), of every
16-bit module tensor and buffer, and the counters and scheduler state. Two checkpoints of
the same training state at different stages / world sizes must dump the same JSON.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(HERE, "..", "..", "fixtures", "gen")
sys.path.insert(0, GEN)
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def worker(ckpt, stage, dtype, extra, out):
    import torch
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    from make_deepspeed_fixtures import build_model, param_groups_spec, ds_config
    from fixture_common import tensor_sha256
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    model = build_model(extra.get("_model"))
    spec = param_groups_spec(model, extra.get("_groups", 2))
    groups = [{"params": [p for _, p in ps], "weight_decay": wd} for _, wd, ps in spec]
    engine, _, _, sched = deepspeed.initialize(model=model, model_parameters=groups,
                                               config=ds_config(stage, dtype, extra))
    path, _ = engine.load_checkpoint(ckpt, load_optimizer_states=True, load_lr_scheduler_states=True)
    assert path is not None, "load_checkpoint found nothing"
    # stage 1/2 link optimizer-state fragments to params lazily (at the first step)
    if hasattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state"):
        engine.optimizer._lazy_init_hp_params_optimizer_state()
    res = {"global_steps": engine.global_steps, "skipped_steps": engine.skipped_steps,
           "lr_scheduler": sched.state_dict() if sched is not None else None, "params": {}}
    for n, p in engine.module.named_parameters():
        numel = p.ds_numel if hasattr(p, "ds_numel") else p.numel()
        if not p.requires_grad or numel == 0:
            continue
        d = {}
        for key, get in (("fp32", lambda: safe_get_full_fp32_param(p)),
                         ("exp_avg", lambda: safe_get_full_optimizer_state(p, "exp_avg")),
                         ("exp_avg_sq", lambda: safe_get_full_optimizer_state(p, "exp_avg_sq"))):
            t = get()
            d[key] = tensor_sha256(t) if t is not None else None
        res["params"][n] = d
    lp = engine._zero3_consolidated_16bit_state_dict() if stage == 3 else engine.module_state_dict()
    if rank == 0:
        res["lp"] = {k: tensor_sha256(v) for k, v in lp.items()}
        with open(out, "w") as f:
            json.dump(res, f, indent=1, sort_keys=True)
    torch.distributed.barrier()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        ckpt, stage, dtype, extra, out = sys.argv[2:7]
        worker(ckpt, int(stage), dtype, json.loads(extra), out)
        from ds_launch import end_worker
        end_worker()
    ckpt, stage, world, dtype, extra, out = sys.argv[1:7]
    from ds_launch import launch
    rc = launch(int(world), [os.path.abspath(__file__), "--worker", ckpt, stage, dtype, extra, out],
                log_prefix=out + ".log")
    sys.exit(rc)


if __name__ == "__main__":
    main()
