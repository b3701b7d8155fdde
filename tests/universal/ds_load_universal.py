"""ds_load_universal.py: one rank of a DeepSpeed engine loading a zckpt universal checkpoint.

    python ds_load_universal.py CASE UNIVERSAL_PARENT STAGE RESULT_JSON   (under gen/ds_launch.py -n W)

Builds the fixture model of CASE (tests/fixtures/gen/make_deepspeed_fixtures.py) with ZeRO
STAGE on W ranks and "checkpoint": {"load_universal": true}, calls
engine.load_checkpoint(UNIVERSAL_PARENT) (which follows latest_universal), and compares, for
every trainable param, the live fp32 master and Adam states (safe_get_full_fp32_param /
safe_get_full_optimizer_state) with the universal files. Rank 0 writes RESULT_JSON.
"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "fixtures", "gen"))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import deepspeed  # noqa: E402
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state  # noqa: E402
import make_deepspeed_fixtures as fx  # noqa: E402


def main():
    case, parent, stage, result = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    _, _, dtype, extra = fx.CASES[case]
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    model = fx.build_model(extra.get("_model"))
    spec = fx.param_groups_spec(model, extra.get("_groups", 2))
    groups = [{"params": [p for _, p in ps], "weight_decay": wd} for _, wd, ps in spec]
    extra = {k: v for k, v in extra.items() if k != "round_robin_gradients"}
    cfg = fx.ds_config(stage, dtype, extra)
    cfg["checkpoint"] = {"load_universal": True}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    engine.load_checkpoint(parent)
    uc = os.path.join(parent, open(os.path.join(parent, "latest_universal")).read())
    errors, checked = [], 0
    for n, p in engine.module.named_parameters():
        if not p.requires_grad or p.numel() == 0:
            continue
        got = {"fp32": safe_get_full_fp32_param(p), "exp_avg": safe_get_full_optimizer_state(p, "exp_avg"),
               "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq")}
        for state, t in got.items():
            ref = torch.load(os.path.join(uc, "zero", n, f"{state}.pt"), weights_only=False)
            ref = ref["param"] if isinstance(ref, dict) else ref
            if t is None or not torch.equal(t.reshape(-1).float(), ref.reshape(-1).float()):
                errors.append(f"{n}.{state}")
        checked += 1
    if rank == 0:
        with open(result, "w") as f:
            json.dump({"errors": errors, "checked": checked, "global_steps": engine.global_steps}, f)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
    from ds_launch import end_worker
    end_worker()
