"""interop_dcp_to_ds.py: DeepSpeed resumes from `zckpt reshard DCP OUT` of a torch FSDP2 run.

The source trains the DeepSpeed fixture model (tests/fixtures/gen/make_deepspeed_fixtures.py: a tied embedding /
head, a frozen Linear, a 1-element param, a float and an int buffer, two param groups) under FSDP2 on the CPU
(fsdp2_harness: init_device_mesh("cpu", (W,)), fully_shard, torch AdamW, gloo) for STEPS steps on the global
batches DeepSpeed's harness uses, saves dcp.save({"model": msd, "optim": osd}) from get_state_dict, snapshots its
full state, and computes the loss of the next global batch as each DeepSpeed target would compute it (the
uninterrupted run's next loss). `zckpt reshard DCP OUT --to-stage S --to-world-size W [--to-dtype bf16]`
converts the save; real DeepSpeed (ds_harness, CPU, torch AdamW, no scheduler: a DCP holds none) builds the same
model at ZeRO-S on W ranks and engine.load_checkpoint(OUT). Checked right after the load:

  state      every trainable param's fp32 master, exp_avg, exp_avg_sq (safe_get_full_*) torch.equal FSDP2's
             full weight and Adam state; Adam's step and global_steps == FSDP2's step; every param group's
             settings (lr, betas, eps, weight_decay, ...) == FSDP2's; the frozen param and both buffers ==
             FSDP2's (bf16 target: the frozen param cast to bf16; DeepSpeed keeps float buffers in float32)
  next loss  DeepSpeed's first loss after the load == the uninterrupted FSDP2 run's (fp32), within bf16
             rounding (bf16)

Also: `zckpt to-universal DCP U [--format ds|hdf5]` then `zckpt reshard U OUT2` gives the same DeepSpeed
checkpoint as the direct reshard at the DCP's own dtype (every file byte for byte but zckpt's manifests); with
--lib, the Python package's zckpt.reshard(dcp, ..., dtype=) and zckpt.to_universal(dcp, ...) give what the
command gives.

An HF Trainer FSDP checkpoint-N (tests/fixtures/dcp/hf_trainer_tied_w2_fp32) resharded to ZeRO-2 W=1: its
scheduler.pt is the lr_scheduler of the model states, its other files are carried over byte for byte,
rng_state_1.pth dropped; DeepSpeed with the fixture's tied HF Llama, the DCP's param groups and a client LambdaLR
(as the Trainer hands DeepSpeed its scheduler) loads it: the scheduler's state is scheduler.pt's, every trainable
param's fp32 master, exp_avg and exp_avg_sq are dcp_to_torch_save's.

A torchtitan step-N (tests/fixtures/dcp/titan_untied_w2_fp32: flatten_optimizer_state_dict, per-param settings
and no group structure; zckpt groups the params whose settings are equal) resharded to ZeRO-2 W=1: DeepSpeed loads
it with those groups and its state is dcp_to_torch_save's.
FSDP2 + tensor parallel (tests/fixtures/dcp/llama_tp2_dp2_fp32: a dp 2 x tp 2 mesh, o_proj and down_proj in blocks
that cut both dimensions) resharded to ZeRO-2 W=1: DeepSpeed loads it and every trainable param's fp32 master,
exp_avg and exp_avg_sq are dcp_to_torch_save's.

Refused (reshard and to-universal: exit 1, one line naming the DCP folder and what is wrong, nothing at OUT):
DCPs torch saves in one process of a model alone, of SGD with momentum, of AdamW with amsgrad.

Prints `N passed, M failed`; exits 0 only if every scenario passes (77 without a zckpt binary).
Usage: interop_dcp_to_ds.py [--lib LIBZCKPT] [SCENARIO...]   (ZCK_BIN = the zckpt binary)
"""
import filecmp
import functools
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch  # noqa: E402
import ds_harness as H  # noqa: E402
import fsdp2_harness as F  # noqa: E402

zckpt_py = None   # the Python package, with --lib
STEPS = 2
BF16_RTOL = 3e-2

# name -> (FSDP2 precision, FSDP2 world size, [(DeepSpeed stage, world size)]). DeepSpeed's logged loss is the
# all-reduced mean of its ranks' losses: at 1 or 2 ranks that sum has one order, the one ds_loss adds in.
SOURCES = {
    "fsdp3_fp32": ("fp32", 3, [(3, 2), (2, 1)]),
    "fsdp2_bf16": ("bf16", 2, [(2, 1)]),
}


# ---- the FSDP2 side (one process per rank)

def fsdp2_worker(spec_path):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    with open(spec_path) as f:
        spec = json.load(f)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = F.build(world, spec["dtype"])
    for k in range(STEPS):
        F.train_step(model, opt, k, rank, world)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=spec["dcp"])

    snap = {"gathered": {}, "lp": {}, "param_groups": [], "step": None}
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        st = opt.state[p]
        snap["gathered"][n] = {"fp32": F.full(p).clone(), "exp_avg": F.full(st["exp_avg"]).clone(),
                               "exp_avg_sq": F.full(st["exp_avg_sq"]).clone()}
        snap["step"] = float(st["step"])
    snap["lp"]["frozen.weight"] = F.full(model.frozen.weight).clone()
    for b in ("shift", "counter"):
        snap["lp"][b] = getattr(model, b).detach().clone()
    snap["param_groups"] = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    # the uninterrupted run's next loss, as each DeepSpeed target computes it (after the snapshot: the
    # forward counts into the `counter` buffer)
    snap["losses"] = {str(w): F.ds_loss(model, STEPS, w) for w in spec["ds_worlds"]}
    if rank == 0:
        torch.save(snap, spec["ref"])
    with open(f"{spec['out']}.rank{rank}.json", "w") as f:
        json.dump({"problems": []}, f)
    dist.barrier()
    dist.destroy_process_group()


# ---- the checks

def compare(ref, res, stage, world, dtype):
    """DeepSpeed's state right after load_checkpoint (ds_harness snapshot) against FSDP2's."""
    snap = res[0]["snap"]
    probs = []
    if set(snap["gathered"]) != set(ref["gathered"]):
        probs.append(f"trainable params {sorted(snap['gathered'])} != FSDP2's {sorted(ref['gathered'])}")
    for n, want in ref["gathered"].items():
        got = snap["gathered"].get(n, {})
        for k in ("fp32", "exp_avg", "exp_avg_sq"):
            if k not in got or not H.same(got[k], want[k].float()):
                probs.append(f"{n}: {k} differs from FSDP2's")
    steps = {float(p["step"]) for p in snap["parts"] if p.get("step") is not None}
    if steps != {ref["step"]}:
        probs.append(f"Adam step {sorted(steps)} != FSDP2's {ref['step']}")
    if snap["global_steps"] != int(ref["step"]):
        probs.append(f"global_steps {snap['global_steps']} != {int(ref['step'])}")
    probs += H.group_settings_problems(snap["param_groups"], ref["param_groups"], "FSDP2")
    lp = snap["lp"]
    if "head.weight" in lp and "embed.weight" in lp and not torch.equal(lp["head.weight"], lp["embed.weight"]):
        probs.append("head.weight and embed.weight differ: no longer tied")
    for n, want in ref["lp"].items():
        if n == "frozen.weight" and dtype == "bf16":
            want = want.to(torch.bfloat16)
        if n not in lp or not H.same(lp[n], want):
            probs.append(f"{n}: {lp.get(n)!r} != FSDP2's {want!r}")
    loss, want = res[0]["losses"][0], ref["losses"][str(world)]
    if dtype == "fp32" and loss != want:
        probs.append(f"next loss {loss!r} != the uninterrupted FSDP2 run's {want!r}")
    if dtype == "bf16" and abs(loss - want) > BF16_RTOL * abs(want):
        probs.append(f"next loss {loss!r} vs the uninterrupted FSDP2 run's {want!r}: beyond bf16 rounding")
    return probs, loss


def zckpt(*args):
    err = H.zckpt(*args)
    return err and f"zckpt {args[0]} failed: {err}"


def same_tree(a, b):
    """Every file of DeepSpeed checkpoint a is in b with the same bytes, and no other (zckpt's manifests aside:
    they name their folder's source)."""
    probs = []
    for root, _, files in os.walk(a):
        for f in files:
            if f == "zckpt-manifest.json":
                continue
            pa = os.path.join(root, f)
            pb = os.path.join(b, os.path.relpath(pa, a))
            if not os.path.exists(pb) or not filecmp.cmp(pa, pb, shallow=False):
                probs.append(f"{os.path.relpath(pa, a)} differs from the direct reshard's")
    for root, _, files in os.walk(b):
        for f in files:
            if not os.path.exists(os.path.join(a, os.path.relpath(os.path.join(root, f), b))):
                probs.append(f"{os.path.relpath(os.path.join(root, f), b)}: not in the direct reshard")
    return probs


def scenario(tmp, name, dtype, world, targets):
    dcp_dir = os.path.join(tmp, name + ".dcp")
    ref_path = os.path.join(tmp, name + ".ref.pt")
    probs, _ = F.launch(tmp, name, world, __file__,
                        {"dtype": dtype, "dcp": dcp_dir, "ref": ref_path, "ds_worlds": sorted({w for _, w in targets})})
    if probs:
        return [(f"{name}: FSDP2 run", probs)]
    ref = torch.load(ref_path, weights_only=False)
    results = []
    # to-universal from the DCP, each in a folder of its own (a reshard of a universal folder carries the other
    # files of the folder holding it, as of an HF checkpoint-N/)
    universal = {}
    for fmt, uname in (("ds", "universal"), ("hdf5", "universal.h5")):
        universal[fmt] = os.path.join(tmp, f"{name}.u-{fmt}", uname)
        err = zckpt("to-universal", "-q", dcp_dir, universal[fmt], "--format", fmt)
        if err:
            results.append((f"{name} -> to-universal --format {fmt}", [err]))
            universal[fmt] = None
    if zckpt_py:
        universal["hdf5 (Python)"] = zckpt_py.to_universal(dcp_dir, os.path.join(tmp, f"{name}.u-py", "universal.h5"),
                                                           format="hdf5")
    for stage, w in targets:
        label = f"{name} -> DeepSpeed ZeRO-{stage} W={w}"
        out = os.path.join(tmp, f"{name}.s{stage}w{w}")
        extra = ["--to-dtype", "bf16"] if dtype == "bf16" else []
        err = zckpt("reshard", "-q", dcp_dir, out, "--to-stage", str(stage), "--to-world-size", str(w), *extra)
        if err:
            results.append((label, [err]))
            continue
        if zckpt_py:
            out_py = zckpt_py.reshard(dcp_dir, out + ".py", stage=stage, world_size=w, dtype="bf16" if extra else None)
            results.append((f"{label}: zckpt.reshard (Python) = the command", same_tree(out, out_py)))
        try:
            res = H.run(tmp, f"{name}.ds{stage}w{w}", w, mode="resume", stage=stage, dtype=dtype, load_dir=out, more=1,
                        no_scheduler=True)
        except Exception as e:  # a DeepSpeed load that failed: one failure, the others go on
            results.append((label, [f"{type(e).__name__}: {e}"]))
            continue
        probs, loss = compare(ref, res, stage, w, dtype)
        results.append((f"{label} (next loss {loss:.7g})", probs))
        # reshard from the universal checkpoints: the same checkpoint as the direct reshard (at the DCP's own
        # dtype: a universal checkpoint keeps the run's, and --to-dtype is for a DCP source)
        if extra:
            out = out + ".dcp-dtype"
            err = zckpt("reshard", "-q", dcp_dir, out, "--to-stage", str(stage), "--to-world-size", str(w))
            if err:
                results.append((f"{label} at the DCP's dtype", [err]))
                continue
        for fmt, u in universal.items():
            if not u:
                continue
            out2 = os.path.join(tmp, f"{name}.s{stage}w{w}.via-{fmt.replace(' ', '')}")
            err = zckpt("reshard", "-q", u, out2, "--to-stage", str(stage), "--to-world-size", str(w))
            results.append((f"{label} via to-universal --format {fmt}", [err] if err else same_tree(out, out2)))
    return results


def ds_loads_like_torch(tmp, label, dcp_dirs, out, model, scheduler):
    """DeepSpeed (ZeRO-2, one rank) loads out; its state is what torch's dcp_to_torch_save reads from dcp_dirs."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    ref = {}
    for i, d in enumerate(dcp_dirs):
        pt = os.path.join(tmp, f"{label}.{i}.pt")
        dcp_to_torch_save(d, pt)
        ref.update(torch.load(pt, weights_only=False))
    if "model" not in ref:   # torchtitan's: model keys at the top, the optimizer flattened
        ref = titan_unflattened(ref)
    osd = ref.get("optimizer", ref.get("optim"))
    spec = {"load": out, "groups": [g["params"] for g in osd["param_groups"]], "out": os.path.join(tmp, f"{label}.ds.pt"),
            "model": model, "scheduler": scheduler}
    err = H.launch_spec(__file__, "--hf-ds", spec["out"] + ".json", spec, 1, os.path.join(tmp, f"{label}.ds.log"), 300)
    probs = []
    if err:
        return None, [f"DeepSpeed failed: {err}"]
    got = torch.load(spec["out"], weights_only=False)
    if sorted(got["gathered"]) != sorted(osd["state"]):
        probs.append(f"trainable params {sorted(got['gathered'])} != the DCP's {sorted(osd['state'])}")
    for n, g in got["gathered"].items():
        if not H.same(g["fp32"], ref["model"][n]):
            probs.append(f"{n}: fp32 master differs from the DCP's weight")
        for k in ("exp_avg", "exp_avg_sq"):
            if n not in osd["state"] or not H.same(g[k], osd["state"][n][k]):
                probs.append(f"{n}: {k} differs from the DCP's")
    return got, probs


def titan_unflattened(sd):
    """dcp_to_torch_save of a torchtitan step-N as get_state_dict's nesting: the model's tensors, the flat
    optimizer's state.<fqn>.<k> per param, and param groups of the params whose param_groups.<fqn>.<k> settings
    are all equal (the flattened form keeps no group structure), in model order."""
    flat = sd["optimizer"]
    model = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    state, settings = {}, {}
    for k, v in flat.items():
        head, rest = k.split(".", 1)
        fqn, key = rest.rsplit(".", 1)
        (state if head == "state" else settings).setdefault(fqn, {})[key] = v
    groups = []
    for fqn in model:
        if fqn not in settings:
            continue
        g = next((g for g in groups if g["settings"] == settings[fqn]), None)
        if g is None:
            g = {"settings": settings[fqn], "params": []}
            groups.append(g)
        g["params"].append(fqn)
    return {"model": model, "optim": {"state": state, "param_groups": groups}}


# committed DCP fixtures resharded to ZeRO-2 W=1 and loaded by DeepSpeed: (name, folder below
# tests/fixtures/dcp, the model's [tied, precision], label)
DCP_FIXTURES = [
    ("tp", "llama_tp2_dp2_fp32", [False, "tp"], "FSDP2 + tensor parallel (2-D blocks) -> DeepSpeed ZeRO-2 W=1: loaded"),
    ("titan", "titan_untied_w2_fp32/step-3", [False, "fp32"],
     "torchtitan step-N (flattened optimizer: per-param settings) -> DeepSpeed ZeRO-2 W=1: loaded"),
]


def dcp_fixtures(tmp):
    results = []
    for name, folder, model, label in DCP_FIXTURES:
        src = os.path.join(H.FIXTURES, "dcp", folder)
        out = os.path.join(tmp, name + ".ds")
        err = zckpt("reshard", "-q", src, out, "--to-stage", "2", "--to-world-size", "1")
        if err:
            results.append((label, [err]))
            continue
        _, probs = ds_loads_like_torch(tmp, name, [src], out, model, False)
        results.append((label, probs))
    return results


def hf_checkpoint(tmp):
    src = os.path.join(HERE, "..", "fixtures", "dcp", "hf_trainer_tied_w2_fp32", "checkpoint-2")
    out = os.path.join(tmp, "hf.ds")
    err = zckpt("reshard", "-q", src, out, "--to-stage", "2", "--to-world-size", "1")
    if err:
        return [("HF Trainer FSDP checkpoint-N -> DeepSpeed", [err])]
    probs = []
    tag = open(os.path.join(out, "latest")).read().strip()
    ms = torch.load(os.path.join(out, tag, "mp_rank_00_model_states.pt"), weights_only=False)
    want = torch.load(os.path.join(src, "scheduler.pt"), weights_only=False)
    if ms["lr_scheduler"] != want:
        probs.append(f"lr_scheduler {ms['lr_scheduler']!r} != scheduler.pt's {want!r}")
    for f in ("scheduler.pt", "trainer_state.json", "rng_state_0.pth"):
        if not filecmp.cmp(os.path.join(src, f), os.path.join(out, f), shallow=False):
            probs.append(f"{f}: not carried over as it is")
    if os.path.exists(os.path.join(out, "rng_state_1.pth")):
        probs.append("rng_state_1.pth carried to a world size of 1")
    results = [("HF Trainer FSDP checkpoint-N -> DeepSpeed W=1: scheduler and side files", probs)]

    # what torch itself reads from the checkpoint, then DeepSpeed's load
    got, probs = ds_loads_like_torch(tmp, "hf", [os.path.join(src, sub) for sub in ("pytorch_model_fsdp_0", "optimizer_0")],
                                     out, [True, "fp32"], True)
    if got is not None and got["lr_scheduler"] != want:
        probs.append(f"DeepSpeed's scheduler state {got['lr_scheduler']!r} != scheduler.pt's {want!r}")
    results.append(("HF Trainer FSDP checkpoint-N -> DeepSpeed ZeRO-2 W=1 with the Trainer's scheduler: loaded", probs))
    return results


def hf_ds_worker(spec_path):
    """DeepSpeed (one rank, ZeRO-2, torch AdamW) on a DCP fixture's Llama (make_dcp_fixtures.build_model(*spec
    model)), the DCP's param groups, with spec scheduler a LambdaLR given as the Trainer gives its scheduler;
    load_checkpoint, then the state it holds."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "gen"))
    import make_dcp_fixtures as M
    with open(spec_path) as f:
        spec = json.load(f)
    deepspeed.init_distributed(dist_backend="gloo")
    model = M.build_model(*spec["model"])
    named = dict(model.named_parameters())
    groups = [{"params": [named[n] for n in g]} for g in spec["groups"]]
    cfg = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**6, "zero_optimization": {"stage": 2},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}}
    sched = (lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)) if spec["scheduler"] else None
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg, lr_scheduler=sched)
    path, _ = engine.load_checkpoint(spec["load"])
    if path is None:
        raise RuntimeError(f"load_checkpoint({spec['load']}) returned None")
    opt = engine.optimizer
    opt._hp_optimizer_states_linked = False   # link the state fragments now (ds_harness.snapshot says why)
    opt._lazy_init_hp_params_optimizer_state()
    res = {"lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler else None, "gathered": {}}
    for n, p in engine.module.named_parameters():
        if p.requires_grad:
            res["gathered"][n] = {"fp32": safe_get_full_fp32_param(p).detach().clone()}
            for k in ("exp_avg", "exp_avg_sq"):
                res["gathered"][n][k] = safe_get_full_optimizer_state(p, k).detach().clone()
    torch.save(res, spec["out"])


def unconvertible(tmp):
    """DCPs that hold no Adam state a DeepSpeed run could resume: refused before anything is written."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    cases = {"model only": (None, "no optimizer state"),
             "SGD momentum": (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "momentum_buffer"),
             "AdamW amsgrad": (lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True), "max_exp_avg_sq")}
    results = []
    for label, (make_opt, needle) in cases.items():
        model = H.fixture().build_model()
        path = os.path.join(tmp, "refused-" + label.replace(" ", "-"))
        if make_opt is None:
            sd = {"model": model.state_dict()}
        else:
            opt = make_opt([p for p in model.parameters() if p.requires_grad])
            ids, tgt = H.batch(0, 0, 1)
            model(ids, tgt).backward()
            opt.step()
            msd, osd = get_state_dict(model, opt)
            sd = {"model": msd, "optim": osd}
        dcp.save(sd, checkpoint_id=path)
        probs = []
        for job in (["reshard", "--to-stage", "2"], ["to-universal"]):
            out = path + "." + job[0]
            r = subprocess.run([H.ZCKPT, job[0], "-q", path, out, *job[1:]], capture_output=True, text=True)
            lines = r.stderr.strip().splitlines()
            if r.returncode != 1 or len(lines) != 1 or path not in lines[0] or needle not in lines[0]:
                probs.append(f"{job[0]}: exit {r.returncode}, expected 1 and one line naming {path} and '{needle}', "
                             f"got {r.stderr.strip()!r}")
            if os.path.exists(out) or any(n.startswith(os.path.basename(out)) or ".zck-dcp-" in n for n in os.listdir(tmp)):
                probs.append(f"{job[0]}: something was left beside {out}")
        results.append((f"{label} -> refused", probs))
    return results


def main(argv):
    global zckpt_py
    if argv[:1] == ["--lib"]:
        os.environ["ZCKPT_LIBRARY"] = argv[1]
        sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
        import zckpt as zckpt_py
        argv = argv[2:]
    if not os.path.exists(H.ZCKPT):
        print(f"skip: no zckpt binary at {H.ZCKPT}")
        return 77
    scenarios = [(name, functools.partial(scenario, name=name, dtype=dtype, world=world, targets=targets))
                 for name, (dtype, world, targets) in SOURCES.items()]
    scenarios += [("refused", lambda tmp: unconvertible(tmp) + hf_checkpoint(tmp)), ("tp", dcp_fixtures)]
    return H.run_scenarios(scenarios, "zck-dcp2ds-", set(argv))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--fsdp2", "--hf-ds"):
        (fsdp2_worker if sys.argv[1] == "--fsdp2" else hf_ds_worker)(sys.argv[2])
        H.end_worker()
    sys.exit(main(sys.argv[1:]))
