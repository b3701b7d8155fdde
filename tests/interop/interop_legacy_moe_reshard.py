"""interop_legacy_moe_reshard.py: `zckpt reshard` of DeepSpeed's legacy MoE checkpoints (deepspeed.moe.layer.MoE,
tests/fixtures/deepspeed-moe) into the same layout at another world size and ZeRO stage, loaded by DeepSpeed
0.19.8's engine with plain load_checkpoint on the CPU (gloo; the fixture generator's model and config:
tests/fixtures/gen/make_legacy_moe_fixtures.py). ep_size 1, and ep_size 2 with the EP size kept (moe_ep2_s2, W 2 ->
4: the experts' group of each EP rank then partitioned over 2 expert-data-parallel ranks; rank r is EP rank r % 2).
At ep_size 2 every state is compared per global expert (EP rank e's local expert l is expert e * local + l: the
name of its expert file), and a reshard to the source's own layout equals DeepSpeed's files object for object (fp32
and bf16, moe_ep2_s2_bf16).

The reference is what DeepSpeed saved: each param's fp32 master, exp_avg, exp_avg_sq and Adam step, cut from the
source's own flat partitions (rank files concatenated, params in param_shapes order), which are the live engine's
(the fp32 masters equal expected_fp32.safetensors too), and each 16-bit weight as the source's `module` and expert
files hold it. Per target, after engine.load_checkpoint: every one of them from the engine's own partitions and
module (the experts' weights loaded from the expert files zckpt wrote) equals it bit for bit, in fp32 and bf16; global_steps is 2; rank 0's loss on the next batch equals the
reference's. zckpt reads the output back: verify clean, consolidate
equal to the source's. The next loss is compared with DeepSpeed resuming the source's own files at its own layout
(the gate's random token selection draws from torch's RNG, which no checkpoint holds: both runs seed it before
that step; one such run serves every source whose saved state is the same bit for bit). A ZeRO-3 target is refused in one line naming deepspeed.moe, nothing written.

Prints `N passed, M failed`; exits 0 only if all pass (77 without a zckpt binary or the fixtures).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEN = os.path.join(SRC, "tests", "fixtures", "gen")
FIX = os.path.join(SRC, "tests", "fixtures", "deepspeed-moe")
ZCKPT = os.environ.get("ZCK_BIN") or os.path.join(SRC, "build", "bin", "zckpt")
sys.path.insert(0, GEN)
from zero12_reload import STATES, check_loaded, check_readback, per_param, run_ranks, saved_states, zero_rank  # noqa: E402

# source -> (world, stage) targets loaded by DeepSpeed: bf16, W 2 -> 1 and ZeRO-2 -> 1 (the expert files' bf16 weights
# cast from the masters); fp32, W 2 -> 3 (padded partitions of the experts' group) and ZeRO-1 -> 2
# ep_size 2, fp32: W 2 -> 4 and ZeRO-2 -> 1 (the experts over 2 expert-data-parallel ranks per EP rank)
TARGETS = [("moe_ep1_s2_bf16", 1, 1), ("moe_ep1_s1", 3, 2), ("moe_ep2_s2", 4, 1)]


def global_name(name, ep_rank, ep_size):
    """The name of EP rank ep_rank's local expert param `name` in the whole model (its expert file's)."""
    import make_legacy_moe_fixtures as g
    m = re.match(r"(.*\.deepspeed_experts\.)(\d+)(\..*)", name)
    return name if not m or ep_size == 1 else f"{m[1]}{int(m[2]) + ep_rank * (g.EXPERTS // ep_size)}{m[3]}"


def ep_groups(partition_counts, world, ep_size):
    """Per flat group: the rank lists whose partitions, concatenated, make one full flat, with their EP rank (the
    experts' group, partitioned over fewer than `world` ranks: one list per EP rank e, ranks e, e + E, ...)."""
    return [[(e, list(range(e, world, ep_size))) for e in range(ep_size)] if c != world else [(0, list(range(world)))]
            for c in partition_counts]


def saved_states_ep(load, model, osd_files, ep_size):
    """saved_states at ep_size > 1: each EP rank's experts under their global names."""
    import torch
    osds = [load(f)["optimizer_state_dict"] for f in sorted(osd_files, key=zero_rank)]
    ref = {"fp32": {}, "exp_avg": {}, "exp_avg_sq": {}, "step": {}}
    for i, ranks in enumerate(ep_groups(osds[0]["partition_count"], len(osds), ep_size)):
        shapes = model["param_shapes"][i]
        numels = [int(torch.Size(s).numel()) for s in shapes.values()]
        for e, rs in ranks:
            names = [global_name(n, e, ep_size) for n in shapes]
            flats = {"fp32": torch.cat([osds[r]["single_partition_of_fp32_groups"][i] for r in rs])}
            for key in ("exp_avg", "exp_avg_sq"):
                flats[key] = torch.cat([osds[r]["base_optimizer_state"]["state"][i][key] for r in rs])
            for key in STATES:
                ref[key].update(per_param(names, numels, flats[key]))
            ref["step"].update({n: float(osds[rs[0]]["base_optimizer_state"]["state"][i]["step"]) for n in names})
    return ref


def worker(spec_path):
    import torch
    import make_legacy_moe_fixtures as g
    import deepspeed
    import deepspeed.comm as dist
    spec = json.load(open(spec_path))
    deepspeed.init_distributed(dist_backend="gloo")
    case = spec["case"]
    model = g.build_model(case)
    cfg = g.ds_config(case)
    cfg["zero_optimization"] = {"stage": spec["stage"]}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=g.model_parameters(case, model), config=cfg)
    rank = dist.get_rank()
    out = {"rank": rank}
    try:
        engine.load_checkpoint(spec["load_dir"], load_optimizer_states=True, load_lr_scheduler_states=True)
    except Exception as e:  # noqa: BLE001 (reported: what DeepSpeed refuses, and why)
        out["error"] = f"{type(e).__name__}: {e}"
        json.dump(out, open(f"{spec['out']}.{rank}", "w"))
        return
    opt = engine.optimizer
    names = {p: n for n, p in engine.module.named_parameters()}
    world, ep = dist.get_world_size(), g.CASES[case][2]
    mine = []
    for i, part in enumerate(opt.single_partition_of_fp32_groups):
        st = opt.optimizer.state[part]
        mine.append({"fp32": part.detach().clone(), "exp_avg": st["exp_avg"].clone(),
                     "exp_avg_sq": st["exp_avg_sq"].clone(), "step": float(st["step"])})
    parts, lps = [None] * world, [None] * world
    torch.distributed.all_gather_object(parts, mine)
    # the 16-bit weights of every EP rank's experts (rank r is EP rank r % ep), under their global names
    torch.distributed.all_gather_object(lps, [(global_name(n, rank % ep, ep), p.detach().clone())
                                              for n, p in engine.module.named_parameters()])
    states = {"global_steps": engine.global_steps, "lp": {n: t for part in lps for n, t in part}}
    counts = [world if not opt.is_moe_param_group[i] else world // ep for i in range(len(opt.bit16_groups))]
    for i, ranks in enumerate(ep_groups(counts, world, ep)):
        group = opt.bit16_groups[i]
        for e, rs in ranks:
            gn = [global_name(names[p], e, ep) for p in group]
            for key in STATES:
                full = torch.cat([parts[r][i][key] for r in rs])
                states.setdefault(key, {}).update(per_param(gn, [p.numel() for p in group], full))
            states.setdefault("step", {}).update({n: parts[rs[0]][i]["step"] for n in gn})
    if rank == 0:
        torch.save(states, spec["out"] + ".states.pt")
    torch.manual_seed(7)  # the gate's random token selection (use_rts) draws from torch's RNG, which is not saved
    out["loss"] = g.train_step(engine, case, 2)
    json.dump(out, open(f"{spec['out']}.{rank}", "w"))


def reference(case):
    """What DeepSpeed saved, per param, from the source's own files."""
    import torch
    tag = os.path.join(FIX, case, "ckpt", "global_step2")
    load = lambda f: torch.load(os.path.join(tag, f), weights_only=False)  # noqa: E731
    model = load("mp_rank_00_model_states.pt")
    files = [f for f in os.listdir(tag) if "zero_pp_rank_" in f]
    ep = json.load(open(os.path.join(FIX, case, "expected.json")))["ep_size"]
    ref = saved_states(load, model, files) if ep == 1 else saved_states_ep(load, model, files, ep)
    ref["lp"] = dict(model["module"])
    for f in os.listdir(tag):  # the experts' 16-bit weights, under their global names
        if f.startswith("layer_") and "_expert_" in f:
            ref["lp"].update(torch.load(os.path.join(tag, f), weights_only=True))
    return ref


def run(tmp, name, case, load_dir, world, stage):
    """DeepSpeed's engine at (world, stage) loading load_dir: (states, rank 0's next loss) or (None, why)."""
    states, losses = run_ranks(__file__, tmp, name, {"case": case, "load_dir": load_dir, "stage": stage}, world)
    return states, losses[0] if states is not None else losses


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

    zck = lambda *a: subprocess.run([ZCKPT, *a], capture_output=True, text=True)
    same = lambda x, y: x.dtype == y.dtype and torch.equal(x, y)
    same_state = lambda a, b: all(set(a[k]) == set(b[k]) and all(same(torch.as_tensor(a[k][n]), torch.as_tensor(b[k][n]))
                                                                 for n in a[k]) for k in (*STATES, "step", "lp"))
    resumed = []  # (reference states, rank 0's next loss when DeepSpeed resumes those files itself)
    with tempfile.TemporaryDirectory() as tmp:
        for case, world, stage in TARGETS:
            name = f"{case} -> W {world}, ZeRO-{stage}"
            info = json.load(open(os.path.join(FIX, case, "expected.json")))
            src, out = os.path.join(FIX, case, "ckpt"), os.path.join(tmp, f"{case}_{world}_{stage}")
            ref = reference(case)
            ref_loss = next((l for r, l in resumed if same_state(r, ref)), None)
            if ref_loss is None:
                st, ref_loss = run(tmp, case + "_ref", case, src, info["world_size"], info["stage"])
                check(st is not None, f"{case}: DeepSpeed does not resume its own files: {ref_loss}")
                if st is None:
                    continue
                resumed.append((ref, ref_loss))
            masters = load_file(os.path.join(FIX, case, "expected_fp32.safetensors"))
            check(set(masters) == set(ref["fp32"]) and all(torch.equal(masters[n].flatten(), t)
                                                            for n, t in ref["fp32"].items()),
                  f"{case}: the source's flat partitions are not the live engine's masters")
            r = zck("reshard", "-q", "--to-world-size", str(world), "--to-stage", str(stage), src, out)
            check(r.returncode == 0, f"{name}: zckpt reshard: {r.stderr.strip()}")
            if r.returncode:
                continue
            check_readback(zck, check, name, src, out)
            states, loss = run(tmp, f"{case}_{world}_{stage}", case, out, world, stage)
            check(states is not None, f"{name}: {loss}")
            if states is None:
                continue
            check(states["global_steps"] == 2, f"{name}: global_steps {states['global_steps']}")
            check_loaded(check, name, ref, states, len(masters), "module and expert files")
            check(loss == ref_loss, f"{name}: next loss {loss} vs {ref_loss} resuming the source's own files")
            print(f"{name}: loaded, every state equal, next loss {loss} = DeepSpeed resuming the source's")
        # ep_size 2 resharded to its own layout: DeepSpeed's own files, object for object (fp32 and bf16)
        import ds_harness as H
        for case in ("moe_ep2_s2", "moe_ep2_s2_bf16"):
            src, out = os.path.join(FIX, case, "ckpt"), os.path.join(tmp, case + "_same")
            r = zck("reshard", "-q", "--to-world-size", "2", "--to-stage", "2", src, out)
            tag = os.path.join(src, "global_step2")
            load = lambda p: torch.load(p, map_location="cpu", weights_only=False)  # noqa: E731
            bad = [f for f in os.listdir(tag) if r.returncode or not os.path.exists(os.path.join(out, "global_step2", f))
                   or not H.same_obj(load(os.path.join(tag, f)), load(os.path.join(out, "global_step2", f)))]
            check(not bad, f"{case} -> its own layout: files differ from DeepSpeed's: {bad} {r.stderr.strip()}")
        out = os.path.join(tmp, "refused")
        r = zck("reshard", "--to-stage", "3", os.path.join(FIX, "moe_ep1_s2", "ckpt"), out)
        check(r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "deepspeed.moe" in r.stderr
              and not os.path.exists(out), f"--to-stage 3: not refused in one line: rc {r.returncode} {r.stderr!r}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        from ds_launch import end_worker
        end_worker()
    if not os.path.exists(ZCKPT) or not os.path.isdir(FIX):
        print("SKIP: no zckpt binary or fixtures")
        sys.exit(77)
    sys.exit(main())
