"""interop_reshard.py: plain DeepSpeed resumes from `zckpt reshard` output and trains on.

Every scenario trains the fixture model (tests/fixtures/gen/make_deepspeed_fixtures.py) with real DeepSpeed
on CPU (gloo, W processes, torch AdamW), saves, runs `zckpt reshard --to-stage S' --to-world-size W'`, and
loads the result in a fresh DeepSpeed engine at (S', W') with plain engine.load_checkpoint (no
load_universal). Checks after the load, on every rank:

  counters   global_steps, global_samples, skipped_steps, lr_scheduler state, the param groups'
             hyper-parameters (per group: lr, betas, eps, weight_decay, ...)   == the source engine's
  gathered   per param: fp32 master, exp_avg, exp_avg_sq (safe_get_full_*)   torch.equal the source engine's
  lp         the full 16-bit state dict with buffers                           torch.equal the source engine's
  parts      this rank's raw flat partitions (fp32, exp_avg, exp_avg_sq, lp): equal to the source state laid
             out by the target's partition math (stage 1/2 alignment padding must be zero; stage 3
             padding is ignored, DeepSpeed itself leaves it uninitialised); step == the source's step
  consolidated  zckpt consolidate of the resharded checkpoint == zero_to_fp32 of the source (bit for bit)

From zckpt's HDF5 container too: `zckpt to-universal --format hdf5` of the source, then `zckpt reshard` of the
container. Its files must be byte for byte the direct reshard's, and DeepSpeed must resume from them with the
source's counters and lr_scheduler state, to exactly the state of the direct reshard.

From DeepSpeed's own universal folder too: ds_to_universal of the source, then `zckpt reshard` of that folder
(no load_universal either). That checkpoint must load to exactly the same state as the direct reshard: every
rank's partitions including padding, counters, the full 16-bit state dict with the frozen param and the buffers
(which the universal folder carries in its copied model-states files), and the same losses.

Where DeepSpeed's own route (ds_to_universal + checkpoint.load_universal) works for the (source, target)
pair, it runs too and both routes must agree exactly: every rank's partitions including padding, counters,
16-bit weights, and the loss curve of the next steps. Where it is broken, the error is recorded
(DeepSpeed 0.19.x: a stage-3 universal checkpoint cannot be loaded by a stage-1/2 engine).

A ZeRO-0 source into stage 1/2 also goes through DeepSpeed's universal route from zckpt's own `to-universal`
folder (ds_to_universal refuses ZeRO-0): load_universal must land on exactly the plain reshard's state, every
rank, and train on with its losses; an fp16 one must come back at the source's dynamic loss scale. An
NVMe-offload source (optimizer swapped to a folder, offloaded_tensors/ in the checkpoint) is resharded into
plain files and loaded as the others; resharded to ZeRO-3 at another world size it keeps its swap files, from
which DeepSpeed run with the NVMe config resumes to the same state and losses.

Training continues: the next MORE steps in the resharded engine give finite, decreasing losses equal to
the source engine continuing directly within LOSS_RTOL. The global batch of each step is the same at any
world size (split over ranks), so the two runs compute the same gradients mathematically; they differ only
in summation order (gradient all-reduce / reduce-scatter over another number of ranks, another flat
layout). For fp32 that is a few ulps, amplified a little by Adam over MORE steps; bf16 rounds the reduced
gradients and weights to 8 bits of mantissa, hence the looser bound there.

Prints `N passed, M failed`; exits 0 only if every scenario passes (77 without a zckpt binary).
Usage: interop_reshard.py [SCENARIO...]   (ZCK_BIN = the zckpt binary)
"""
import contextlib
import filecmp
import functools
import glob
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch  # noqa: E402
import ds_harness as H  # noqa: E402

STEPS, MORE = 2, 3
# fp16: the state after the load is checked exactly (and the first loss is the source's), but ZeRO-0's
# FP16_UnfusedOptimizer and ZeRO-1/2's fp16 step unscale and clip in another order: 1% apart after 3 steps
# (the same at the source's world size)
LOSS_RTOL = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 3e-2}

# (name, source (stage, W), target (stage, W), dtype, also run DeepSpeed's universal route)
SCENARIOS = [
    # ZeRO-0 sources (the optimizer state in the model file; FP16_UnfusedOptimizer for bf16). ds_to_universal
    # refuses ZeRO-0; the first also loads zckpt's to-universal folder with load_universal (stage 1/2 targets)
    ("0w2->1w3", (0, 2), (1, 3), "bf16", False),
    ("0w1->3w2", (0, 1), (3, 2), "fp32", False),
    # fp16 ZeRO-0 (FP16_UnfusedOptimizer with a dynamic loss scale): the scale carried as a DynamicLossScaler
    ("0w2->2w1", (0, 2), (2, 1), "fp16", False),
    # ZeRO-0 under FP16_Optimizer (DeepSpeed's FusedAdam, the GPU default): flat fp32 groups cut back into params
    # by value; into ZeRO-2 with FusedAdam too
    ("fused 0w2->2w3", (0, 2), (2, 3), "fp16", False),
    ("fused 0w1->1w2", (0, 1), (1, 2), "bf16", False),
    # NVMe-offload source (optimizer swapped to a folder; offloaded_tensors/ in the checkpoint) into plain files
    ("nvme 3w2->2w1", (3, 2), (2, 1), "fp32", False),
    # NVMe-offload source into an NVMe-offload target at another world size (--to-offload keep): swap files
    ("nvme 3w2->3w1 nvme", (3, 2), (3, 1), "fp32", False),
    # BF16_Optimizer source (bf16 + ZeRO-1 + fp32 gradient accumulation) into plain ZeRO files
    ("bf16opt 1w2->2w3", (1, 2), (2, 3), "bf16", False),
    ("3w4->2w2", (3, 4), (2, 2), "bf16", True),
    ("1w1->3w3", (1, 1), (3, 3), "fp32", False),
    ("2w2->2w4", (2, 2), (2, 4), "bf16", True),
    ("3w3->1w1", (3, 3), (1, 1), "fp32", False),
]


# ------------------------------------------------------------------------------------------------
# expected partitions
# ------------------------------------------------------------------------------------------------

def flat_groups():
    """Trainable param names per optimizer param group, in flat order (fixture's decay / no-decay split)."""
    m = H.fixture()
    return [[n for n, _ in ps] for _, _, ps in m.param_groups_spec(m.build_model())]


def layout(stage, world, rank, full, numel):
    """This rank's flat partition per flat group of `full` (name -> tensor), and a mask of real elements.
    Stage 1/2: per group cat(params) zero-padded to align(N, 2W), slice [rP, rP+P).
    Stage 3 (one sub-group per group, sub_group_size 1e9): per param [r*p, (r+1)*p), p = ceil(n/W)."""
    out = []
    for names in flat_groups():
        if stage <= 2:
            flat = torch.cat([full[n].reshape(-1) for n in names])
            n_all = flat.numel()
            m = -(-n_all // (2 * world)) * 2 * world
            p = m // world
            flat = torch.cat([flat, torch.zeros(m - n_all, dtype=flat.dtype)])
            mask = torch.arange(m) < n_all
            out.append((flat[rank * p:(rank + 1) * p], mask[rank * p:(rank + 1) * p]))
        else:
            segs, masks = [], []
            for n in names:
                t = full[n].reshape(-1)
                p = -(-numel[n] // world)
                seg = t[rank * p:min((rank + 1) * p, numel[n])]
                segs.append(torch.cat([seg, torch.zeros(p - seg.numel(), dtype=t.dtype)]))
                masks.append(torch.arange(p) < seg.numel())
            out.append((torch.cat(segs), torch.cat(masks)))
    return out


# ------------------------------------------------------------------------------------------------
# comparisons: each returns a list of problems (strings)
# ------------------------------------------------------------------------------------------------

def describe(a, b):
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return f"{type(a).__name__} vs {type(b).__name__}"
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    d = (a.double() - b.double()).abs()
    i = int(d.reshape(-1).argmax())
    return (f"{int((d > 0).sum())}/{a.numel()} elements differ, max |diff| {d.max().item():.3g} "
            f"at {i} ({a.reshape(-1)[i].item()!r} vs {b.reshape(-1)[i].item()!r})")


def values_equal(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return H.same(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def cmp_counters(got, ref, who):
    probs = []
    for k in ("global_steps", "global_samples", "skipped_steps", "lr_scheduler"):
        if not values_equal(got[k], ref[k]):
            probs.append(f"{who}: {k} {got[k]!r}, expected {ref[k]!r}")
    if len(got["param_groups"]) != len(ref["param_groups"]):
        probs.append(f"{who}: {len(got['param_groups'])} param groups, expected {len(ref['param_groups'])}")
    for g, (a, b) in enumerate(zip(got["param_groups"], ref["param_groups"])):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b or not values_equal(a[k], b[k]):
                probs.append(f"{who}: param_groups[{g}][{k!r}] {a.get(k, '<absent>')!r}, "
                             f"expected {b.get(k, '<absent>')!r}")
    return probs


def cmp_gathered(got, ref, who):
    probs = []
    if list(got) != list(ref):
        probs.append(f"{who}: trainable params {list(got)}, expected {list(ref)}")
    for n in ref:
        for k in ("fp32", "exp_avg", "exp_avg_sq"):
            if n in got and not H.same(got[n][k], ref[n][k]):
                probs.append(f"{who}: {n} {k}: {describe(got[n][k], ref[n][k])}")
    return probs


def cmp_lp(got, ref, who):
    probs = []
    if list(got) != list(ref):
        probs.append(f"{who}: 16-bit state dict keys {list(got)}, expected {list(ref)}")
    for k in ref:
        if k in got and not H.same(got[k], ref[k]):
            probs.append(f"{who}: 16-bit {k}: {describe(got[k], ref[k])}")
    return probs


def cmp_parts_expected(res, src_snap, stage, world):
    """Every target rank's raw partitions vs the source state laid out for (stage, world)."""
    probs = []
    g = src_snap["gathered"]
    numel = {n: t["fp32"].numel() for n, t in g.items()}
    src_step = src_snap["parts"][0]["step"]
    for r, rr in enumerate(res):
        parts = rr["snap"]["parts"]
        exp = {k: layout(stage, world, r, {n: t[k] for n, t in g.items()}, numel)
               for k in ("fp32", "exp_avg", "exp_avg_sq")}
        exp["lp"] = layout(stage, world, r, src_snap["lp"], numel)
        if len(parts) != len(exp["fp32"]):
            probs.append(f"rank {r}: {len(parts)} flat groups, expected {len(exp['fp32'])}")
            continue
        for gi, part in enumerate(parts):
            if not values_equal(part["step"], src_step):
                probs.append(f"rank {r} group {gi}: step {part['step']!r}, expected {src_step!r}")
            for k in ("fp32", "exp_avg", "exp_avg_sq", "lp"):
                want, mask = exp[k][gi]
                got = part[k]
                if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
                    probs.append(f"rank {r} group {gi} {k}: {describe(got, want)}")
                    continue
                if stage <= 2:  # DeepSpeed zero-pads stage 1/2 flat groups: padding must be zero
                    if not H.same(got, want):
                        probs.append(f"rank {r} group {gi} {k}: {describe(got, want)}")
                elif not H.same(got[mask], want[mask]):
                    probs.append(f"rank {r} group {gi} {k}: {describe(got[mask], want[mask])} (real elements)")
    return probs


def cmp_routes(zr, ur):
    """zckpt route vs DeepSpeed's universal route: everything, every rank, padding included."""
    probs = []
    for r, (a, b) in enumerate(zip(zr, ur)):
        sa, sb = a["snap"], b["snap"]
        probs += cmp_counters(sa, sb, f"rank {r} vs universal")
        probs += cmp_gathered(sa["gathered"], sb["gathered"], f"rank {r} vs universal")
        for gi, (pa, pb) in enumerate(zip(sa["parts"], sb["parts"])):
            for k in ("fp32", "exp_avg", "exp_avg_sq", "lp", "step"):
                if not values_equal(pa[k], pb[k]):
                    probs.append(f"rank {r} group {gi} {k} vs universal: {describe(pa[k], pb[k])}")
        if "lp" in sa:  # trainable params only: a universal load restores neither buffers nor frozen params
            names = set(sa["gathered"])
            probs += cmp_lp({k: v for k, v in sa["lp"].items() if k in names},
                            {k: v for k, v in sb["lp"].items() if k in names}, "vs universal")
    if zr[0]["losses"] != ur[0]["losses"]:
        probs.append(f"losses {zr[0]['losses']} vs universal route {ur[0]['losses']}")
    return probs


def cmp_same_load(zr, xr, who):
    """Two checkpoints that must load identically: everything, every rank, padding included."""
    probs = []
    for r, (a, b) in enumerate(zip(zr, xr)):
        sa, sb = a["snap"], b["snap"]
        probs += cmp_counters(sb, sa, f"rank {r} {who}")
        probs += cmp_gathered(sb["gathered"], sa["gathered"], f"rank {r} {who}")
        if len(sa["parts"]) != len(sb["parts"]):
            probs.append(f"rank {r} {who}: {len(sb['parts'])} flat groups, expected {len(sa['parts'])}")
        for gi, (pa, pb) in enumerate(zip(sa["parts"], sb["parts"])):
            for k in ("fp32", "exp_avg", "exp_avg_sq", "lp", "step"):
                if not values_equal(pb[k], pa[k]):
                    probs.append(f"rank {r} group {gi} {k} {who}: {describe(pb[k], pa[k])}")
    probs += cmp_lp(xr[0]["snap"]["lp"], zr[0]["snap"]["lp"], who)
    if xr[0]["losses"] != zr[0]["losses"]:
        probs.append(f"losses {xr[0]['losses']} {who} vs {zr[0]['losses']}")
    return probs


def cmp_losses(got, direct, before, dtype):
    probs = []
    if not all(math.isfinite(x) for x in got):
        probs.append(f"non-finite loss {got}")
    if not (got[0] < before[-1] and all(b < a for a, b in zip(got, got[1:]))):
        probs.append(f"loss not decreasing: before {before}, after load {got}")
    tol = LOSS_RTOL[dtype]
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, direct))
    if worst > tol:
        probs.append(f"losses {got} vs direct continuation {direct}: rel diff {worst:.3g} > {tol}")
    return probs, worst


def consolidate_pt(zck_ckpt, tmp):
    """zckpt consolidate --format pt of zck_ckpt: (its state dict, None), or (None, the problem)."""
    out = os.path.join(tmp, "consolidated")
    err = H.zckpt("consolidate", "-q", "--format", "pt", zck_ckpt, out)
    if err:
        return None, f"zckpt consolidate failed: {err}"
    return torch.load(os.path.join(out, "pytorch_model.bin"), weights_only=True), None


def consolidated(zck_ckpt, src_ckpt, tmp, frozen_kept):
    """zckpt consolidate of the resharded checkpoint vs DeepSpeed zero_to_fp32 of the source. Stage-1
    checkpoints carry no frozen-parameter info (DeepSpeed never saves it there): frozen_kept=False."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    ours, err = consolidate_pt(zck_ckpt, tmp)
    if err:
        return [err]
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        ref = get_fp32_state_dict_from_zero_checkpoint(src_ckpt)
    probs = []
    for k, t in ref.items():
        if k in ours and not H.same(ours[k], t):
            probs.append(f"consolidated {k}: {describe(ours[k], t)}")
    frozen = set(H.fixture_frozen()) if not frozen_kept else set()
    missing = [k for k in ref if k not in ours and k not in frozen]
    if missing:
        probs.append(f"consolidated: missing {missing}")
    return probs


# ------------------------------------------------------------------------------------------------

def reshard(src, out, stage, world):
    return H.zckpt("reshard", "-q", src, out, "--to-stage", str(stage), "--to-world-size", str(world))


BF16_OPTIMIZER = {"data_types": {"grad_accum_dtype": "fp32"}}


def consolidated_live(zck_ckpt, src_snap, tmp):
    """Where zero_to_fp32 cannot read the source (ZeRO-0, BF16_Optimizer): zckpt consolidate of the reshard
    holds the source engine's fp32 masters."""
    ours, err = consolidate_pt(zck_ckpt, tmp)
    if err:
        return [err]
    return [f"consolidated {n}: {describe(ours.get(n), g['fp32'])}" for n, g in src_snap["gathered"].items()
            if not H.same(ours.get(n), g["fp32"])]


def scenario_plain(name, src_cfg, dst_cfg, dtype, tmp):
    """A source zero_to_fp32 and ds_to_universal cannot read (ZeRO-0, BF16_Optimizer, NVMe offload): the reshard
    loads to the source engine's state and trains on with its losses."""
    (s0, w0), (s1, w1) = src_cfg, dst_cfg
    notes, probs = [], []
    t0 = time.time()
    top = BF16_OPTIMIZER if name.startswith("bf16opt") else {}
    nvme = os.path.join(tmp, "nvme") if name.startswith("nvme") else None
    fused = name.startswith("fused")
    src_dir = os.path.join(tmp, "src")
    src = H.run(tmp, "src", w0, mode="train", stage=s0, dtype=dtype, steps=STEPS, more=MORE, save_dir=src_dir,
                perturb_frozen=True, top=top, nvme=nvme, fused_adam=fused)
    tag = open(os.path.join(src_dir, "latest")).read().strip()
    if nvme and not glob.glob(os.path.join(src_dir, tag, "offloaded_tensors", "rank*", "*.tensor.swp")):
        return ["the NVMe source saved no swap files (nothing was offloaded)"], notes
    ref = src[0]["snap"]
    if fused and ref["optimizer"] != "FP16_Optimizer/FusedAdam":
        return [f"the source engine ran {ref['optimizer']}, not FP16_Optimizer/FusedAdam"], notes
    out = os.path.join(tmp, "zck")
    err = reshard(src_dir, out, s1, w1)
    if err:
        return [f"zckpt reshard failed: {err}"], notes
    try:
        zr = H.run(tmp, "zck", w1, mode="resume", stage=s1, dtype=dtype, more=MORE, load_dir=out, fused_adam=fused)
    except H.RunFailed as e:
        return [f"DeepSpeed load/train of the resharded checkpoint failed: {e}"], notes
    for r, rr in enumerate(zr):
        probs += cmp_counters(rr["snap"], ref, f"rank {r}")
        probs += cmp_gathered(rr["snap"]["gathered"], ref["gathered"], f"rank {r}")
    probs += cmp_lp(zr[0]["snap"]["lp"], ref["lp"], "rank 0")
    probs += cmp_parts_expected(zr, ref, s1, w1)
    probs += consolidated_live(out, ref, tmp)
    if dtype == "fp16" and not values_equal(zr[0]["snap"]["loss_scale"], ref["loss_scale"]):
        probs.append(f"loss scale {zr[0]['snap']['loss_scale']!r} after the load, the source's {ref['loss_scale']!r}")
    lp, worst = cmp_losses(zr[0]["losses"], src[0]["losses"], src[0]["losses_before"], dtype)
    probs += lp
    notes.append(f"losses {['%.6f' % x for x in zr[0]['losses']]} vs direct {['%.6f' % x for x in src[0]['losses']]} "
                 f"(max rel diff {worst:.2g})")
    if fused:
        notes.append(f"source {ref['optimizer']}, target {zr[0]['snap']['optimizer']}")
    if s0 == 0 and s1 in (1, 2) and not probs:
        # DeepSpeed's universal route from zckpt's folder of the ZeRO-0 source (what ds_to_universal writes for the
        # equivalent ZeRO-1 checkpoint): load_universal lands on exactly the plain reshard's state, every rank
        uc_root = os.path.join(tmp, "zuc")
        os.makedirs(uc_root)
        r = subprocess.run([H.ZCKPT, "to-universal", "-q", os.path.join(src_dir, tag),
                            os.path.join(uc_root, tag + "_universal")], capture_output=True, text=True)
        if r.returncode:
            probs.append(f"zckpt to-universal of the ZeRO-0 source failed: {r.stderr.strip() or r.returncode}")
        else:
            try:
                ur = H.run(tmp, "zuc", w1, mode="resume", stage=s1, dtype=dtype, more=MORE, load_dir=uc_root,
                           universal=True, perturb_frozen=True, fused_adam=fused)
                up = cmp_routes(zr, ur)
                if dtype == "fp16" and not values_equal(ur[0]["snap"]["loss_scale"], ref["loss_scale"]):
                    up.append(f"loss scale {ur[0]['snap']['loss_scale']!r} after load_universal, the source's "
                              f"{ref['loss_scale']!r}")
                probs += up
                if not up:
                    notes.append("load_universal of zckpt's to-universal folder: the plain reshard's partitions, "
                                 "counters, 16-bit weights and losses on every rank")
            except H.RunFailed as e:
                probs.append(f"DeepSpeed load_universal of zckpt's to-universal folder failed: {e}")
    notes.append(f"{time.time() - t0:.0f} s")
    return probs, notes


def scenario_nvme_target(name, src_cfg, dst_cfg, dtype, tmp):
    """An NVMe-offload source resharded into an NVMe-offload target (the default, --to-offload keep): DeepSpeed run
    with the same NVMe config at the target world size resumes from the swap files zckpt wrote exactly as it
    resumes from its own checkpoint at the source's world size.

    DeepSpeed 0.19.8 with NVMe offload reads no optimizer state from the optim files (engine.load_checkpoint
    skips _load_zero_checkpoint) and, with torch Adam, not the swapped Adam moments either (its swapper knows only
    the state tensors Adam has made: none before the first step, which then writes fresh ones over the copied
    files). What it resumes is the swapped fp32 masters. So this runs with one param group and one sub-group per
    rank (sub_group_size 1e9), which swaps at both world sizes, and checks: the masters and 16-bit weights equal
    the source engine's bit for bit, the moments missing just as after DeepSpeed's own resume, the next loss the
    source engine's; and resharded at the source's world size, every loss of DeepSpeed's own resume exactly.
    The moments zckpt wrote are checked by reading them back (test_nvme)."""
    (s0, w0), (s1, w1) = src_cfg, dst_cfg
    notes, probs = [], []
    t0 = time.time()
    spec = dict(nvme_min_bytes=512, sub_group_size=10**9, one_group=True)
    src_dir = os.path.join(tmp, "src")
    src = H.run(tmp, "src", w0, mode="train", stage=s0, dtype=dtype, steps=STEPS, more=MORE, save_dir=src_dir,
                perturb_frozen=True, nvme=os.path.join(tmp, "nvme_src"), **spec)
    tag = open(os.path.join(src_dir, "latest")).read().strip()
    if len(glob.glob(os.path.join(src_dir, tag, "offloaded_tensors", "rank*", "*.tensor.swp"))) != 3 * w0:
        return ["the NVMe source did not swap its one sub-group on every rank"], notes
    ref = src[0]["snap"]
    out = os.path.join(tmp, "zck")
    err = reshard(src_dir, out, s1, w1)
    if err:
        return [f"zckpt reshard failed: {err}"], notes
    swaps = sorted(os.path.relpath(p, os.path.join(out, tag))
                   for p in glob.glob(os.path.join(out, tag, "offloaded_tensors", "rank*", "*.tensor.swp")))
    if len(swaps) != 3 * w1:
        return [f"the reshard wrote swap files {swaps}, not three per target rank"], notes
    # and at the source's own world size: DeepSpeed must resume from it exactly as from its own checkpoint
    out_same = os.path.join(tmp, "zck_same")
    err = reshard(src_dir, out_same, s0, w0)
    if err:
        return [f"zckpt reshard at the source's world size failed: {err}"], notes
    try:
        own = H.run(tmp, "own", w0, mode="resume", stage=s0, dtype=dtype, more=MORE, load_dir=src_dir,
                    nvme=os.path.join(tmp, "nvme_own"), **spec)
        zr = H.run(tmp, "zck", w1, mode="resume", stage=s1, dtype=dtype, more=MORE, load_dir=out,
                   nvme=os.path.join(tmp, "nvme_zck"), **spec)
        sr = H.run(tmp, "zsame", w0, mode="resume", stage=s0, dtype=dtype, more=MORE, load_dir=out_same,
                   nvme=os.path.join(tmp, "nvme_zsame"), **spec)
    except H.RunFailed as e:
        return [f"DeepSpeed (NVMe offload) load/train failed: {e}"], notes
    if sr[0]["losses"] != own[0]["losses"]:
        probs.append(f"at W {w0}: losses {sr[0]['losses']} after resuming zckpt's NVMe reshard, {own[0]['losses']} "
                     f"after DeepSpeed's own checkpoint")
    for r, rr in enumerate(zr):
        # counters and scheduler as the source engine's; param groups as after DeepSpeed's own NVMe resume (which
        # does not restore their lr either: the scheduler sets it at the next step)
        probs += cmp_counters(dict(rr["snap"], param_groups=ref["param_groups"]), ref, f"rank {r}")
        if rr["snap"]["param_groups"] != own[0]["snap"]["param_groups"]:
            probs.append(f"rank {r}: param groups {rr['snap']['param_groups']}, DeepSpeed's own resume "
                         f"{own[0]['snap']['param_groups']}")
        for n, g in ref["gathered"].items():
            got = rr["snap"]["gathered"].get(n)
            if got is None or not H.same(got["fp32"], g["fp32"]):
                probs.append(f"rank {r}: {n} fp32 master: {describe(got and got['fp32'], g['fp32'])}")
            for k in ("exp_avg", "exp_avg_sq"):
                mine, theirs = got and got[k], own[0]["snap"]["gathered"][n][k]
                if (mine is None) != (theirs is None) or (mine is not None and not H.same(mine, theirs)):
                    probs.append(f"rank {r}: {n} {k} after the load: {describe(mine, theirs)} (DeepSpeed's own resume)")
    probs += cmp_lp(zr[0]["snap"]["lp"], ref["lp"], "rank 0")
    probs += consolidated_live(out, ref, tmp)
    r = subprocess.run([H.ZCKPT, "verify", "-q", out], capture_output=True, text=True)
    if r.returncode:
        probs.append(f"zckpt verify of the NVMe reshard: exit {r.returncode}: {r.stdout.strip()} {r.stderr.strip()}")
    # the next loss (the weights as loaded) is the source engine's; the later ones are not comparable across world
    # sizes here: with fresh moments Adam's first step is lr * sign(g), which flips with the summation order for
    # gradients near 0
    if not math.isclose(zr[0]["losses"][0], src[0]["losses"][0], rel_tol=1e-6):
        probs.append(f"next loss {zr[0]['losses'][0]!r} after the load, the source engine's {src[0]['losses'][0]!r}")
    worst = abs(zr[0]["losses"][0] - src[0]["losses"][0]) / abs(src[0]["losses"][0])
    moments = "not resumed" if own[0]["snap"]["gathered"][next(iter(ref["gathered"]))]["exp_avg"] is None else "resumed"
    notes.append(f"swap files {swaps}; Adam moments {moments} by DeepSpeed's NVMe load, its own checkpoint's as "
                 f"zckpt's; next loss {zr[0]['losses'][0]:.7f} vs the source engine's {src[0]['losses'][0]:.7f} (rel "
                 f"diff {worst:.2g}); at W {w0} the losses of DeepSpeed's own resume exactly; {time.time() - t0:.0f} s")
    return probs, notes


def scenario(name, src_cfg, dst_cfg, dtype, with_universal, tmp):
    (s0, w0), (s1, w1) = src_cfg, dst_cfg
    if name.startswith("nvme") and name.endswith(" nvme"):
        return scenario_nvme_target(name, src_cfg, dst_cfg, dtype, tmp)
    if s0 == 0 or name.startswith("bf16opt") or name.startswith("nvme"):
        return scenario_plain(name, src_cfg, dst_cfg, dtype, tmp)
    notes, probs = [], []
    t0 = time.time()
    src_dir = os.path.join(tmp, "src")
    src = H.run(tmp, "src", w0, mode="train", stage=s0, dtype=dtype, steps=STEPS, more=MORE, save_dir=src_dir,
                perturb_frozen=True)
    ref = src[0]["snap"]
    direct = src[0]["losses"]
    before = src[0]["losses_before"]
    tag = open(os.path.join(src_dir, "latest")).read().strip()

    out = os.path.join(tmp, "zck")
    err = reshard(src_dir, out, s1, w1)
    if err:
        return [f"zckpt reshard failed: {err}"], notes
    try:
        zr = H.run(tmp, "zck", w1, mode="resume", stage=s1, dtype=dtype, more=MORE, load_dir=out)
    except H.RunFailed as e:
        return [f"DeepSpeed load/train of the resharded checkpoint failed: {e}"], notes

    for r, rr in enumerate(zr):
        probs += cmp_counters(rr["snap"], ref, f"rank {r}")
        probs += cmp_gathered(rr["snap"]["gathered"], ref["gathered"], f"rank {r}")
    probs += cmp_lp(zr[0]["snap"]["lp"], ref["lp"], "rank 0")
    probs += cmp_parts_expected(zr, ref, s1, w1)
    probs += consolidated(out, src_dir, tmp, frozen_kept=s1 > 1)
    lp, worst = cmp_losses(zr[0]["losses"], direct, before, dtype)
    probs += lp
    notes.append(f"losses {['%.6f' % x for x in zr[0]['losses']]} vs direct {['%.6f' % x for x in direct]} "
                 f"(max rel diff {worst:.2g})")

    # the HDF5 container: to-universal --format hdf5, then reshard; the files are those of the direct reshard
    # (byte for byte) and DeepSpeed resumes from them to the same state, scheduler included
    h5 = os.path.join(tmp, "uc.h5")
    r = subprocess.run([H.ZCKPT, "to-universal", "-q", "--format", "hdf5", src_dir, h5], capture_output=True, text=True)
    out_h = os.path.join(tmp, "zck_from_h5")
    err = (r.stderr.strip() or f"exit {r.returncode}") if r.returncode else reshard(h5, out_h, s1, w1)
    if err:
        probs.append(f"zckpt to-universal --format hdf5 / reshard of the container failed: {err}")
    else:
        diff = [f for f in sorted(os.listdir(os.path.join(out, tag)))
                if not filecmp.cmp(os.path.join(out, tag, f), os.path.join(out_h, tag, f), shallow=False)]
        if diff:
            probs.append(f"reshard of the HDF5 container: {diff} differ from the direct reshard's")
        try:
            hr = H.run(tmp, "zh5", w1, mode="resume", stage=s1, dtype=dtype, more=MORE, load_dir=out_h)
            for rk, rr in enumerate(hr):
                probs += cmp_counters(rr["snap"], ref, f"rank {rk} from the HDF5 container")
            hp = cmp_same_load(zr, hr, "from the HDF5 container")
            probs += hp
            if not hp and not diff:
                notes.append("zckpt reshard of the HDF5 container: the same files, loads to the same state "
                             "(lr_scheduler included), same losses")
        except H.RunFailed as e:
            probs.append(f"DeepSpeed load/train of the reshard of the HDF5 container failed: {e}")

    uc_root = os.path.join(tmp, "uc")
    os.makedirs(uc_root)
    uc_err = H.ds_to_universal(os.path.join(src_dir, tag), os.path.join(uc_root, tag + "_universal"),
                               os.path.join(tmp, "uc.log"))
    if uc_err:
        probs.append(f"ds_to_universal failed: {uc_err}")
    else:
        # zckpt reshard of DeepSpeed's universal folder: the same checkpoint as the direct reshard
        out_u = os.path.join(tmp, "zck_from_uc")
        err = reshard(uc_root, out_u, s1, w1)
        if err:
            probs.append(f"zckpt reshard of ds_to_universal's folder failed: {err}")
        else:
            try:
                xr = H.run(tmp, "zuc", w1, mode="resume", stage=s1, dtype=dtype, more=MORE, load_dir=out_u)
                up = cmp_same_load(zr, xr, "from ds_to_universal's folder")
                probs += up
                if not up:
                    notes.append("zckpt reshard of ds_to_universal's folder: loads to the same state, same losses")
            except H.RunFailed as e:
                probs.append(f"DeepSpeed load/train of the reshard of ds_to_universal's folder failed: {e}")

    if with_universal:
        err = uc_err
        if err is None:
            try:
                ur = H.run(tmp, "uc", w1, mode="resume", stage=s1, dtype=dtype, more=MORE, load_dir=uc_root,
                           universal=True, perturb_frozen=True)
            except H.RunFailed as e:
                err = f"load_universal failed: {e}"
        else:
            err = f"ds_to_universal failed: {err}"
        if err:
            notes.append(f"DeepSpeed's universal route is broken here ({err}); compared with the source "
                         f"engine's own state instead")
        else:
            up = cmp_routes(zr, ur)
            probs += up
            if not up:
                notes.append("universal route: every rank's partitions, counters, 16-bit weights and losses equal")
    notes.append(f"{time.time() - t0:.0f} s")
    return probs, notes


def async_io_usable():
    """Whether DeepSpeed can build its async_io op (NVMe offload needs it, and it needs libaio)."""
    try:
        from deepspeed.ops.op_builder import AsyncIOBuilder
        return bool(AsyncIOBuilder().is_compatible(verbose=False))
    except Exception:  # noqa: an import or probe failure means it cannot be used either
        return False


def main():
    if not os.path.exists(H.ZCKPT):
        print(f"SKIP: no zckpt binary at {H.ZCKPT} (set ZCK_BIN)")
        return 77
    cases, skipped = [], 0
    only = sys.argv[1:]
    for name, src_cfg, dst_cfg, dtype, uni in SCENARIOS:
        if only and name not in only:
            continue
        if name.startswith("nvme") and not async_io_usable():
            # DeepSpeed itself cannot offload to NVMe here: there is no source to make
            skipped += 1
            print(f"skip {name} ({dtype}): DeepSpeed's async_io op cannot be built here (libaio-dev missing)")
            continue
        cases.append((f"{name} ({dtype})", functools.partial(scenario, name, src_cfg, dst_cfg, dtype, uni)))
    return H.run_cases(cases, "zck_interop_reshard_", skipped=skipped)


if __name__ == "__main__":
    sys.exit(main())
