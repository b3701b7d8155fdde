"""interop_autoep_reshard.py: `zckpt reshard` of DeepSpeed AutoEP checkpoints into AutoEP's own layout at another world
size, EP size and ZeRO stage (1, 2 or 3), loaded by DeepSpeed 0.19.8's AutoEP engine with plain load_checkpoint (no
load_universal) on the CPU (gloo, the fixture generator's model, config and shims: tests/fixtures/gen/
make_autoep_fixtures.py).

Per source: the reference is DeepSpeed's own engine loading the source's own files at the source's layout (the run
resumed uninterrupted). Per target: after engine.load_checkpoint every state (fp32 masters, exp_avg, exp_avg_sq,
the module's 16-bit weights; expert params concatenated over the EP group in expert order) equals the reference's
bit for bit, global_steps too, and the next step's loss on each rank the reference also has (same rank, same batch)
is the reference's. zckpt reads its output back (verify clean, consolidate = the source's consolidate); a few more
targets (bf16, Qwen3-MoE, W 4 -> 2) are checked that way only.
What the writer does not take (an EP size that does not divide) is refused in one line naming AutoEP, nothing
written.

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
from zero12_reload import run_ranks  # noqa: E402

# source case -> targets (world, ep, stage); the source's own layout is the reference run
TARGETS = {
    # DP 2 -> 4 (experts over 2 edp ranks); EP 2 -> 1; ZeRO-2 -> ZeRO-3 with sub_group_size 600 (each group, the
    # experts' too, split into sub-groups, as a large model's default 1e9 does); ZeRO-2 -> ZeRO-1 at EP 1
    "ep2_s2_fp32": [(4, 2, 2), (2, 1, 2), (2, 2, 3, 600), (2, 1, 1)],
    # ZeRO-3 -> ZeRO-2; ZeRO-3 at W 4 (experts over 2 edp ranks); ZeRO-3 -> ZeRO-1
    "ep2_s3_fp32": [(2, 2, 2), (4, 2, 3), (2, 2, 1)],
}
# resharded and read back by zckpt only (each DeepSpeed launch costs a minute on a small CI machine): bf16, where
# verify checks every expert file's 16-bit weights against the masters they were cast from
ZCKPT_ONLY = [("ep2_s2_bf16", 2, 1, 2), ("ep2dp2_s2_fp32", 2, 2, 2), ("qwen3_ep2_s2_bf16", 4, 1, 2),
              ("ep2_s3_bf16", 4, 1, 3), ("ep2dp2_s3_fp32", 2, 2, 1)]
# refused in one line naming AutoEP: (source, zckpt reshard args)
REFUSED = [("ep2_s2_fp32", ["--to-world-size", "2", "--to-ep-size", "3"]),
           ("ep2_s2_fp32", ["--to-world-size", "6", "--to-ep-size", "3"])]


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
    cfg = g.ds_config(spec["case"])
    cfg["zero_optimization"] = {"stage": spec["stage"], **({"sub_group_size": spec["sgs"]} if spec.get("sgs") else {})}
    cfg["expert_parallel"] = {"enabled": True, "autoep_size": spec["ep"]}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[{"params": list(model.parameters()),
                                                                            "name": "params"}], config=cfg)
    rank = dist.get_rank()
    out = {"rank": rank}
    try:
        engine.load_checkpoint(spec["load_dir"], load_optimizer_states=True, load_lr_scheduler_states=True)
    except Exception as e:  # noqa: BLE001 (reported: what DeepSpeed refuses, and why)
        import traceback
        out["error"] = f"{type(e).__name__}: {e} at " + " <- ".join(
            f"{os.path.basename(f.filename)}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)[::-1][:4])
        json.dump(out, open(f"{spec['out']}.{rank}", "w"))
        return
    # ZeRO-1/2 link the params' views of the loaded Adam state at the next step; read them now
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link:
        link()
    states = {"global_steps": engine.global_steps}
    for key, get in (("fp32", safe_get_full_fp32_param),
                     ("exp_avg", lambda p: safe_get_full_optimizer_state(p, "exp_avg")),
                     ("exp_avg_sq", lambda p: safe_get_full_optimizer_state(p, "exp_avg_sq")),
                     ("lp", g.module_weight)):
        states[key] = g.gather(engine, get, spec["ep"])
    if rank == 0:
        torch.save(states, spec["out"] + ".states.pt")
    out["loss"] = g.train_step(engine, 2, rank)
    json.dump(out, open(f"{spec['out']}.{rank}", "w"))


def run(tmp, name, case, load_dir, world, ep, stage, sgs=None):
    """DeepSpeed's engine at (world, ep, stage, sub_group_size) loading load_dir: (states, losses by rank) or (None,
    why)."""
    return run_ranks(__file__, tmp, name, {"case": case, "load_dir": load_dir, "ep": ep, "stage": stage, "sgs": sgs},
                     world)


def main():
    import torch
    from safetensors.torch import load_file
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        passed += bool(ok)
        failed += not ok
        if not ok:
            print("FAIL:", what)

    with tempfile.TemporaryDirectory() as tmp:
        for case, targets in TARGETS.items():
            info = json.load(open(os.path.join(FIX, case, "expected.json")))
            src = os.path.join(FIX, case, "ckpt")
            ref, ref_loss = run(tmp, f"{case}_ref", case, src, info["world_size"], info["ep_size"], info["stage"])
            check(ref is not None, f"{case}: DeepSpeed does not resume its own checkpoint: {ref_loss}")
            if ref is None:
                continue
            c = subprocess.run([ZCKPT, "consolidate", "-q", src, os.path.join(tmp, case + ".safetensors")],
                               capture_output=True, text=True)
            check(c.returncode == 0, f"{case}: consolidate: {c.stderr.strip()}")
            want_hf = load_file(os.path.join(tmp, case + ".safetensors")) if c.returncode == 0 else {}
            for world, ep, stage, *sgs in targets:
                sgs = sgs[0] if sgs else None
                name = f"{case} -> W {world}, EP {ep}, ZeRO-{stage}" + (f", sub_group_size {sgs}" if sgs else "")
                out = os.path.join(tmp, f"{case}_{world}_{ep}_{stage}")
                r = subprocess.run([ZCKPT, "reshard", "-q", "--to-world-size", str(world), "--to-ep-size", str(ep),
                                    "--to-stage", str(stage), *(["--sub-group-size", str(sgs)] if sgs else []), src,
                                    out], capture_output=True, text=True)
                check(r.returncode == 0, f"{name}: zckpt reshard: {r.stderr.strip()}")
                if r.returncode:
                    continue
                v = subprocess.run([ZCKPT, "verify", out], capture_output=True, text=True)
                check(v.returncode == 0, f"{name}: verify: {v.stdout[-600:]} {v.stderr.strip()}")
                c = subprocess.run([ZCKPT, "consolidate", "-q", out, out + ".safetensors"], capture_output=True,
                                   text=True)
                check(c.returncode == 0, f"{name}: consolidate: {c.stderr.strip()}")
                if c.returncode == 0:
                    got = load_file(out + ".safetensors")
                    check(set(got) == set(want_hf) and all(torch.equal(got[k], want_hf[k]) for k in got),
                          f"{name}: consolidate of the output differs from the source's")
                states, loss = run(tmp, f"{case}_{world}_{ep}_{stage}", case, out, world, ep, stage, sgs)
                check(states is not None, f"{name}: {loss}")
                if states is None:
                    continue
                check(states["global_steps"] == ref["global_steps"],
                      f"{name}: global_steps {states['global_steps']} vs {ref['global_steps']}")
                for key in ("fp32", "exp_avg", "exp_avg_sq", "lp"):
                    bad = [n for n, t in ref[key].items() if n not in states[key] or states[key][n].dtype != t.dtype
                           or not torch.equal(states[key][n], t)]
                    check(not bad and set(states[key]) == set(ref[key]),
                          f"{name}: {key} after load differs from DeepSpeed resuming its own files: {bad[:4]}")
                n = min(len(loss), len(ref_loss))
                check(loss[:n] == ref_loss[:n], f"{name}: next loss {loss} vs the uninterrupted run's {ref_loss}")
                print(f"{name}: loaded, every state equal, next loss {loss[:n]} = the uninterrupted run's")
        for case, world, ep, stage in ZCKPT_ONLY:
            name = f"{case} -> W {world}, EP {ep}, ZeRO-{stage}"
            src, out = os.path.join(FIX, case, "ckpt"), os.path.join(tmp, f"{case}_{world}_{ep}_{stage}")
            r = subprocess.run([ZCKPT, "reshard", "-q", "--to-world-size", str(world), "--to-ep-size", str(ep),
                                "--to-stage", str(stage), src, out], capture_output=True, text=True)
            v = subprocess.run([ZCKPT, "verify", out], capture_output=True, text=True) if r.returncode == 0 else r
            a = subprocess.run([ZCKPT, "consolidate", "-q", src, out + ".a.safetensors"], capture_output=True, text=True)
            b = subprocess.run([ZCKPT, "consolidate", "-q", out, out + ".b.safetensors"], capture_output=True, text=True)
            ok = not (r.returncode or v.returncode or a.returncode or b.returncode)
            if ok:
                x, y = load_file(out + ".a.safetensors"), load_file(out + ".b.safetensors")
                ok = set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x)
            check(ok, f"{name}: reshard / verify / consolidate: {r.stderr.strip()} {v.stdout[-400:]} {v.stderr.strip()} "
                      f"{b.stderr.strip()}")
            print(f"{name}: written, verify clean, consolidate = the source's")
        for case, args in REFUSED:
            out = os.path.join(tmp, "refused")
            r = subprocess.run([ZCKPT, "reshard", *args, os.path.join(FIX, case, "ckpt"), out], capture_output=True,
                               text=True)
            check(r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and not os.path.exists(out)
                  and ("AutoEP" in r.stderr or "EP size" in r.stderr),
                  f"{case} {' '.join(args)}: not refused in one line: rc {r.returncode} {r.stderr!r}")
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
