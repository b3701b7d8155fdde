"""interop_autoep_load_universal.py: DeepSpeed 0.19.8's AutoEP engine loads `zckpt to-universal`'s folder of an AutoEP
checkpoint ("checkpoint": {"load_universal": true}), at the source's layout and at others, on the CPU (2 ranks, gloo,
the fixture generator's model, config and shims: tests/fixtures/gen/make_autoep_fixtures.py).

Per target: after engine.load_checkpoint every rank's fp32 masters and Adam moments (safe_get_full_fp32_param /
safe_get_full_optimizer_state, expert params concatenated over the EP group in expert order) equal the universal
files bit for bit, the masters equal the live source engine's (expected_fp32), and the next step's loss (same batch)
is the same at every target of one source: at the source's layout (EP 2) and at EP 1 x expert-data-parallel 2.
A target DeepSpeed's loader refuses is reported as such (the test then says which, and fails).

Prints `N passed, M failed`; exits 0 only if all pass (77 without a zckpt binary or the fixtures).
"""
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEN = os.path.join(SRC, "tests", "fixtures", "gen")
FIX = os.path.join(SRC, "tests", "fixtures", "autoep")
ZCKPT = os.environ.get("ZCK_BIN") or os.path.join(SRC, "build", "bin", "zckpt")
sys.path.insert(0, GEN)

# source case, target (ep, stage) on 2 ranks
# (DeepSpeed's loader cannot take a ZeRO-1/2 source's universal folder into a ZeRO-3 engine, AutoEP or not: that
# engine looks for zero_pp_rank_*_mp_rank_00_model_states.pt, which such a folder does not carry; checked by hand)
TARGETS = [("ep2_s2_fp32", 2, 2), ("ep2_s2_fp32", 1, 2), ("ep2_s3_fp32", 2, 3)]


def worker(spec_path):
    import torch
    import make_autoep_fixtures as g
    g.install_shims()
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    spec = json.load(open(spec_path))
    deepspeed.init_distributed(dist_backend="gloo")
    model = g.build_model()
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": True}},
           "zero_optimization": {"stage": spec["stage"]}, "expert_parallel": {"enabled": True, "autoep_size": spec["ep"]},
           "bf16": {"enabled": False}, "gradient_clipping": 1.0, "checkpoint": {"load_universal": True}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[{"params": list(model.parameters()),
                                                                            "name": "params"}], config=cfg)
    rank = dist.get_rank()
    out = {"rank": rank}
    try:
        engine.load_checkpoint(spec["load_dir"], tag=spec["tag"], load_optimizer_states=True,
                               load_lr_scheduler_states=True)
    except Exception as e:  # noqa: BLE001 (reported: which target DeepSpeed refuses, and why)
        import traceback
        out["error"] = f"{type(e).__name__}: {e} at " + " <- ".join(
            f"{os.path.basename(f.filename)}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)[::-1][:4])
        json.dump(out, open(f"{spec['out']}.{rank}", "w"))
        return
    states = {}
    for key, get in (("fp32", safe_get_full_fp32_param),
                     ("exp_avg", lambda p: safe_get_full_optimizer_state(p, "exp_avg")),
                     ("exp_avg_sq", lambda p: safe_get_full_optimizer_state(p, "exp_avg_sq"))):
        states[key] = g.gather(engine, get, spec["ep"])
    if rank == 0:
        torch.save(states, spec["out"] + ".states.pt")
    out["loss"] = g.train_step(engine, 2, rank)
    json.dump(out, open(f"{spec['out']}.{rank}", "w"))


def main():
    import torch
    from safetensors.torch import load_file
    from ds_launch import launch
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        passed += bool(ok)
        failed += not ok
        if not ok:
            print("FAIL:", what)

    with tempfile.TemporaryDirectory() as tmp:
        made, losses = {}, {}
        for case, ep, stage in TARGETS:
            if case not in made:
                uc = os.path.join(tmp, case, "uc")
                r = subprocess.run([ZCKPT, "to-universal", "-q", os.path.join(FIX, case, "ckpt"), uc],
                                   capture_output=True, text=True)
                check(r.returncode == 0, f"{case}: to-universal: {r.stderr.strip()}")
                made[case] = uc
            uc = made[case]
            name = f"{case} -> EP {ep}, ZeRO-{stage}"
            spec = os.path.join(tmp, f"{case}_{ep}_{stage}.json")
            out = os.path.join(tmp, f"{case}_{ep}_{stage}.out")
            json.dump({"load_dir": os.path.dirname(uc), "tag": "uc", "ep": ep, "stage": stage, "out": out},
                      open(spec, "w"))
            rc = launch(2, [os.path.abspath(__file__), "--worker", spec], timeout=600,
                        log_prefix=os.path.join(tmp, f"{case}_{ep}_{stage}"))
            res = [json.load(open(f"{out}.{r}")) for r in range(2) if os.path.exists(f"{out}.{r}")]
            if rc or len(res) != 2:
                logs = ""
                for r in range(2):
                    p = os.path.join(tmp, f"{case}_{ep}_{stage}.rank{r}.log")
                    if os.path.exists(p):
                        logs += open(p).read()[-1500:]
                check(False, f"{name}: the ranks failed (rc {rc}): {logs}")
                continue
            errs = [x["error"] for x in res if "error" in x]
            check(not errs, f"{name}: DeepSpeed's load_checkpoint refuses it: {errs[:1]}")
            if errs:
                continue
            states = torch.load(out + ".states.pt", weights_only=False)
            want = load_file(os.path.join(FIX, case, "expected_fp32.safetensors"))
            bad = [k for k in want if not torch.equal(states["fp32"][k], want[k])]
            check(not bad and set(states["fp32"]) == set(want), f"{name}: masters differ from the source's: {bad[:4]}")
            for key in ("fp32", "exp_avg", "exp_avg_sq"):
                diff = []
                for n, t in states[key].items():
                    f = torch.load(os.path.join(uc, "zero", n, f"{key}.pt"), weights_only=False)
                    f = f["param"] if isinstance(f, dict) else f
                    if not torch.equal(t.reshape(-1), f.reshape(-1)):
                        diff.append(n)
                check(not diff, f"{name}: {key} after load differs from the universal files: {diff[:4]}")
            loss = [x["loss"] for x in sorted(res, key=lambda x: x["rank"])]
            check(losses.setdefault(case, loss) == loss, f"{name}: next loss {loss}, another layout's {losses[case]}")
            print(f"{name}: loaded, states equal, next loss {loss}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        from ds_launch import end_worker
        end_worker()
    if not os.path.exists(ZCKPT) or not os.path.isdir(FIX):
        print("SKIP: no zckpt binary or no AutoEP fixtures")
        sys.exit(77)
    sys.exit(main())
