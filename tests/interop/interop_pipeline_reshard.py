"""interop_pipeline_reshard.py: `zckpt reshard` of DeepSpeed PipelineModule checkpoints (tests/fixtures/deepspeed-moe/
pipe_*: 2 stages, layer_<XX>-model_states.pt beside one mp_rank_<stage> file set per stage; tests/fixtures/
deepspeed-pipe/pipe_tied_pp2_s1: the same with a TiedLayerSpec weight in both stages) into the same pipeline layout at
another data-parallel size, loaded by DeepSpeed 0.19.8's PipelineEngine with plain load_checkpoint on the CPU (gloo;
the fixture generators' models and configs: tests/fixtures/gen/make_legacy_moe_fixtures.py and
make_pipe_tied_fixtures.py).

The reference is what DeepSpeed saved: each param's fp32 master, exp_avg and exp_avg_sq cut from its stage's own flat
partitions (that stage's dp rank files concatenated, params in its param_shapes order), its Adam step, and each 16-bit weight as its
layer file holds it. Per target, after engine.load_checkpoint on every rank of (2 stages x new dp): each of them from
the engines' own partitions and modules equals it bit for bit; global_steps is 2; the loss of the next batch equals the
loss the live engine took there before the fixture was saved (loss_step3: the pipeline draws nothing at random, and
every dp rank reads the same batch). zckpt reads the output back: verify clean, consolidate equal to the source's.
A ZeRO-2 target is refused in one line naming the PipelineModule, nothing written.

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
FIXTURES = os.path.join(SRC, "tests", "fixtures")
ZCKPT = os.environ.get("ZCK_BIN") or os.path.join(SRC, "build", "bin", "zckpt")
sys.path.insert(0, GEN)
from zero12_reload import STATES, check_loaded, check_readback, per_param, run_ranks, saved_states  # noqa: E402

PP = 2
# source -> dp size of the target: fp32 dp 1 -> 2 (4 ranks), bf16 dp 2 -> 1 (2 ranks); with a TiedLayerSpec weight
# (each stage's flat group holds a copy: stage 1's is written from stage 0's) fp32 dp 1 -> 2
TARGETS = [("pipe_pp2_s1", 2), ("pipe_pp2_dp2_bf16", 1), ("pipe_tied_pp2_s1", 2)]
# case -> (fixture folder, the generator module that builds its model)
SOURCES = {"pipe_pp2_s1": ("deepspeed-moe", "make_legacy_moe_fixtures"),
           "pipe_pp2_dp2_bf16": ("deepspeed-moe", "make_legacy_moe_fixtures"),
           "pipe_tied_pp2_s1": ("deepspeed-pipe", "make_pipe_tied_fixtures"),
           "pipe_tied_pp2_dp2_bf16": ("deepspeed-pipe", "make_pipe_tied_fixtures")}  # not a target (CI time)


def fix(case):
    return os.path.join(FIXTURES, SOURCES[case][0])


def worker(spec_path):
    import importlib
    import torch
    import deepspeed
    import deepspeed.comm as dist
    spec = json.load(open(spec_path))
    g = importlib.import_module(SOURCES[spec["case"]][1])
    deepspeed.init_distributed(dist_backend="gloo")
    case = spec["case"]
    model = g.build_model(case)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=g.model_parameters(case, model),
                                           config=g.ds_config(case))
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
    groups = getattr(opt, "bit16_groups", None) or opt.bf16_groups
    flats = getattr(opt, "single_partition_of_fp32_groups", None) or opt.fp32_groups_flat_partition
    mine = []
    for i, part in enumerate(flats):
        st = opt.optimizer.state[part]
        mine.append({"names": [names[p] for p in groups[i]], "numels": [p.numel() for p in groups[i]],
                     "fp32": part.detach().clone(), "exp_avg": st["exp_avg"].clone(),
                     "exp_avg_sq": st["exp_avg_sq"].clone(), "step": float(st["step"])})
    lp = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    parts = [None] * dist.get_world_size()
    torch.distributed.all_gather_object(parts, (engine.stage_id, engine.grid.data_parallel_id, mine, lp,
                                                engine.global_steps))
    if rank == 0:
        states = {"lp": {}, "global_steps": sorted({x[4] for x in parts})}
        for stage in sorted({x[0] for x in parts}):
            ranks = sorted((x for x in parts if x[0] == stage), key=lambda x: x[1])
            for x in ranks:
                states["lp"].update(x[3])
            for i, grp in enumerate(ranks[0][2]):
                for key in STATES:
                    full = torch.cat([x[2][i][key] for x in ranks])
                    states.setdefault(key, {}).update(per_param(grp["names"], grp["numels"], full))
                states.setdefault("step", {}).update({n: grp["step"] for n in grp["names"]})
        torch.save(states, spec["out"] + ".states.pt")
    out["loss"] = g.train_step(engine, case, 2)
    json.dump(out, open(f"{spec['out']}.{rank}", "w"))


def reference(case):
    """What DeepSpeed saved, per param, from the source's own files: every stage's flat groups, the layer files."""
    import importlib
    import torch
    g = importlib.import_module(SOURCES[case][1])
    names = g.layer_names(case) if hasattr(g, "layer_names") else {}  # a TiedLayerSpec's layer file: its module's
    tag = os.path.join(fix(case), case, "ckpt", "global_step2")
    load = lambda f: torch.load(os.path.join(tag, f), weights_only=False)  # noqa: E731
    ref = {"fp32": {}, "exp_avg": {}, "exp_avg_sq": {}, "step": {}, "lp": {}}
    for f in sorted(os.listdir(tag)):
        if f.startswith("layer_"):
            prefix = names.get(int(f[6:8]), f"{int(f[6:8])}.")
            ref["lp"].update({prefix + k: v for k, v in load(f).items()})
    for s in range(PP):
        suffix = f"_mp_rank_{s:02d}_optim_states.pt"
        stage = saved_states(load, load(f"mp_rank_{s:02d}_model_states.pt"),
                             [f for f in os.listdir(tag) if f.endswith(suffix) and "zero_pp_rank_" in f])
        for key, v in stage.items():
            ref[key].update(v)
    return ref


def run(tmp, name, case, load_dir, world):
    """PipelineEngine on `world` ranks loading load_dir: (states, rank 0's next loss) or (None, why)."""
    states, losses = run_ranks(__file__, tmp, name, {"case": case, "load_dir": load_dir}, world)
    return states, losses[0] if states is not None else losses


def main():
    if not os.path.exists(ZCKPT) or not all(os.path.isdir(os.path.join(fix(c), c)) for c, _ in TARGETS):
        print("SKIP: no zckpt binary or fixtures")
        return 77
    import torch
    from safetensors.torch import load_file
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        passed += bool(ok)
        failed += not ok
        if not ok:
            print("FAIL:", what)

    zck = lambda *a: subprocess.run([ZCKPT, *a], capture_output=True, text=True)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        for case, dp in TARGETS:
            name = f"{case} -> dp {dp}"
            info = json.load(open(os.path.join(fix(case), case, "expected.json")))
            src, out = os.path.join(fix(case), case, "ckpt"), os.path.join(tmp, f"{case}_{dp}")
            ref = reference(case)
            masters = load_file(os.path.join(fix(case), case, "expected_fp32.safetensors"))
            check(set(masters) == set(ref["fp32"]) and all(torch.equal(masters[n].flatten(), t)
                                                            for n, t in ref["fp32"].items()),
                  f"{case}: the source's flat partitions are not the live engine's masters")
            r = zck("reshard", "-q", "--to-world-size", str(dp), src, out)
            check(r.returncode == 0, f"{name}: zckpt reshard: {r.stderr.strip()}")
            if r.returncode:
                continue
            check_readback(zck, check, name, src, out)
            states, loss = run(tmp, f"{case}_{dp}", case, out, PP * dp)
            check(states is not None, f"{name}: {loss}")
            if states is None:
                continue
            check(states["global_steps"] == [2], f"{name}: global_steps {states['global_steps']}")
            check_loaded(check, name, ref, states, len(masters), "layer files")
            check(loss == info["loss_step3"], f"{name}: next loss {loss} vs {info['loss_step3']} (the live engine's)")
            print(f"{name}: loaded, every state equal, next loss {loss} = the live engine's")
        out = os.path.join(tmp, "refused")
        r = zck("reshard", "--to-stage", "2", os.path.join(fix("pipe_pp2_s1"), "pipe_pp2_s1", "ckpt"), out)
        check(r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "PipelineModule" in r.stderr
              and not os.path.exists(out), f"--to-stage 2: not refused in one line: rc {r.returncode} {r.stderr!r}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        from ds_launch import end_worker
        end_worker()
    sys.exit(main())
