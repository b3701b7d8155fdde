"""ds_harness.py: run real DeepSpeed (CPU, gloo, W processes) on the fixture model and snapshot its state.

Used by interop_reshard.py and the other interop scripts that run DeepSpeed; its last section holds what
they share besides (the zckpt binary, the fixtures, comparisons, reporting). The model, param groups and
ds_config come from tests/fixtures/gen/make_deepspeed_fixtures.py and the launcher from
tests/fixtures/gen/ds_launch.py (imported, not copied). Two kinds of run, both launched as W processes of this
file (`--worker SPEC`):

  train:  train `steps` steps from the fixture's initial weights, save_checkpoint(save_dir),
          snapshot, then train `more` steps (the "direct path" loss curve).
  resume: build a fresh engine, load_checkpoint(load_dir) (plain, or with checkpoint.load_universal),
          snapshot, then train `more` steps.
Spec `nvme` (a folder): the optimizer offloaded to "NVMe" there (offload_optimizer device nvme, async_io);
`nvme_min_bytes`: the smallest fp32 partition swapped (MIN_AIO_BYTES and aio.block_size; default 512);
`sub_group_size` applies with `nvme` too. Spec `one_group`: every trainable param in one param group.

The frozen parameter is perturbed (spec perturb_frozen) in the source run, so that a resume which does not
restore it from the checkpoint shows. A universal-checkpoint resume never loads the module (weights come from
zero/<param>/, frozen params and buffers not at all), so it gets the same perturbation, as a user would rebuild
the frozen weights.

Data: every optimizer step k (= engine.global_steps before the step) uses one fixed global batch of
GLOBAL_BATCH sequences (seeded by k, learnable targets) split evenly over the W ranks, so runs at different
world sizes compute the same global gradient up to reduction order. The logged loss is the mean over ranks.

Snapshot (torch.save'd per rank to OUT.rank<r>.pt):
  counters  global_steps, global_samples, skipped_steps, lr_scheduler state, param-group hyper-parameters
  gathered  per trainable param: full fp32 master, exp_avg, exp_avg_sq (DeepSpeed's safe_get_full_* API)
  lp        the full 16-bit (here: lp dtype) state dict incl. buffers, gathered (stage 3) or module_state_dict
  parts     this rank's raw flat partitions per flat group: fp32, exp_avg, exp_avg_sq, step, lp
"""
import collections
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(os.path.dirname(HERE), "fixtures", "gen")
sys.path.insert(0, GEN)
from ds_launch import end_worker  # noqa: E402  (the workers' clean end, re-exported)
os.environ.setdefault("DS_ACCELERATOR", "cpu")

GLOBAL_BATCH = 12  # divisible by every world size used (1..4)
SEQ = 5


def fixture():
    import make_deepspeed_fixtures as m
    return m


def fixture_frozen():
    return [n for n, p in fixture().build_model().named_parameters() if not p.requires_grad]


# NVMe offload as the fixtures s3w2_fp32_nvme / s3w1_bf16_nvme have it: sub-groups of 100 elements, the ones of
# at least 512 bytes swapped (MIN_AIO_BYTES lowered from 1 MiB, aio.block_size 512) to a folder
NVME_EXTRA = {"sub_group_size": 100, "_nvme": True, "_aio_block": 512}
NVME_MIN_AIO_BYTES = 512


def make_config(stage, world, dtype, sub_group_size=None, universal=False, nvme_path=None, fused_adam=False,
                nvme_min_bytes=NVME_MIN_AIO_BYTES):
    m = fixture()
    extra = {} if sub_group_size is None else {"sub_group_size": sub_group_size}
    if nvme_path:
        extra = dict(NVME_EXTRA, _nvme_path=nvme_path, _aio_block=nvme_min_bytes,
                     **({} if sub_group_size is None else {"sub_group_size": sub_group_size}))
    if fused_adam:  # DeepSpeed's FusedAdam (its CPU op, JIT-built): FP16_Optimizer at ZeRO-0 fp16/bf16
        extra = dict(extra, _fused_adam=True)
    cfg = m.ds_config(stage, dtype, extra)
    cfg["train_micro_batch_size_per_gpu"] = GLOBAL_BATCH // world
    cfg["steps_per_print"] = 10**6
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    return cfg


def batch(k, rank, world):
    import torch
    m = fixture()
    g = torch.Generator().manual_seed(5000 + k)
    ids = torch.randint(0, m.VOCAB, (GLOBAL_BATCH, SEQ), generator=g)
    tgt = (ids * 7 + 3) % m.VOCAB  # learnable, so the loss really decreases
    n = GLOBAL_BATCH // world
    return ids[rank * n:(rank + 1) * n], tgt[rank * n:(rank + 1) * n]


def train_steps(engine, n):
    import torch
    import torch.distributed as dist
    losses = []
    for _ in range(n):
        ids, tgt = batch(engine.global_steps, dist.get_rank(), dist.get_world_size())
        loss = engine(ids, tgt)
        engine.backward(loss)
        engine.step()
        t = loss.detach().float().clone()
        dist.all_reduce(t)
        losses.append((t / dist.get_world_size()).item())
    return losses


def _plain(v):
    import torch
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def snapshot(engine, stage):
    import torch
    import torch.distributed as dist
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    opt = engine.optimizer
    basic = getattr(opt, "optimizer", opt)  # ZeRO-0 fp32: the torch optimizer itself
    rank = dist.get_rank()
    snap = {
        "optimizer": type(opt).__name__ + "/" + type(basic).__name__,   # e.g. FP16_Optimizer/FusedAdam
        "global_steps": engine.global_steps,
        "global_samples": engine.global_samples,
        "skipped_steps": engine.skipped_steps,
        "lr_scheduler": _plain(engine.lr_scheduler.state_dict()) if engine.lr_scheduler is not None else None,
        "param_groups": [{k: _plain(v) for k, v in g.items() if k != "params"} for g in basic.param_groups],
        "loss_scale": _plain(getattr(opt, "loss_scale", None)),   # fp16: the dynamic scale in force
    }
    # stage 1/2: after a plain load_checkpoint the optimizer-state fragments are linked only at the next step
    # (_lazy_init_hp_params_optimizer_state), so safe_get_full_optimizer_state would fail before that
    # (and, DeepSpeed 0.19.8 bug, with several param groups the link after the first step runs when only group 0
    # has state, so later groups never get linked): re-link explicitly; it only creates views
    if hasattr(opt, "_lazy_init_hp_params_optimizer_state") and basic.state:
        opt._hp_optimizer_states_linked = False
        opt._lazy_init_hp_params_optimizer_state()
    if stage == 0:
        return snapshot_zero0(engine, snap)
    # NVMe offload: DeepSpeed 0.19.8 resumes the swapped masters but not the Adam moments (the swapper knows only
    # the state tensors torch Adam has made, none before the first step, which then overwrites the copied files):
    # recorded as None
    no_moments = getattr(opt, "swap_optimizer", False) and not any("exp_avg" in s for s in basic.state.values())
    gathered = collections.OrderedDict()
    for n, p in engine.module.named_parameters():
        if not p.requires_grad:
            continue
        gathered[n] = {"fp32": safe_get_full_fp32_param(p).detach().clone()}
        for key in ("exp_avg", "exp_avg_sq"):
            gathered[n][key] = None if no_moments else safe_get_full_optimizer_state(p, key).detach().clone()
    snap["gathered"] = gathered
    if stage == 3:
        lp = engine._zero3_consolidated_16bit_state_dict()
    else:
        lp = engine.module_state_dict()
    if rank == 0:
        snap["lp"] = collections.OrderedDict((k, v.detach().clone()) for k, v in lp.items())
    parts = []
    if stage == 3:
        flats = list(zip(opt.fp32_partitioned_groups_flat, opt.fp16_partitioned_groups_flat))
    elif hasattr(opt, "fp32_groups_flat_partition"):  # BF16_Optimizer
        flats = [(f, opt.bf16_partitioned_groups[g][rank]) for g, f in enumerate(opt.fp32_groups_flat_partition)]
    else:
        flats = [(f, opt.parallel_partitioned_bit16_groups[g][rank])
                 for g, f in enumerate(opt.single_partition_of_fp32_groups)]
    for fp32, lpflat in flats:
        st = basic.state.get(fp32, {})
        parts.append({"fp32": fp32.detach().clone(), "lp": lpflat.detach().clone(),
                      "exp_avg": _plain(st.get("exp_avg")), "exp_avg_sq": _plain(st.get("exp_avg_sq")),
                      "step": _plain(st.get("step"))})
    snap["parts"] = parts
    return snap


def snapshot_zero0(engine, snap):
    """ZeRO-0 has no hp mapping: FP16_UnfusedOptimizer (bf16) keeps the masters in fp32_groups, parallel to
    fp16_groups; an fp32 engine trains the params themselves. The Adam state is the torch optimizer's, keyed by
    the master. `parts` holds only the step (there are no flat partitions)."""
    import torch.distributed as dist
    opt = engine.optimizer
    basic = getattr(opt, "optimizer", opt)
    master = {}
    if hasattr(opt, "fp32_groups"):
        for lg, mg in zip(opt.fp16_groups, opt.fp32_groups):
            for lp_p, m in zip(lg, mg):
                master[id(lp_p)] = m
    # FP16_Optimizer (FusedAdam): one flat fp32 master per group and the Adam state over it; each param's
    # slice is its own _unflatten_dense_tensors view
    flat_of = {}
    if hasattr(opt, "fp32_groups_flat"):
        from torch._utils import _unflatten_dense_tensors
        for lg, flat in zip(opt.fp16_groups, opt.fp32_groups_flat):
            st = basic.state.get(flat, {})
            views = [_unflatten_dense_tensors(t, lg) if t is not None else [None] * len(lg)
                     for t in (flat, st.get("exp_avg"), st.get("exp_avg_sq"))]
            for lp_p, m, ea, eas in zip(lg, *views):
                flat_of[id(lp_p)] = (m, {"exp_avg": ea, "exp_avg_sq": eas, "step": st.get("step")})
    gathered = collections.OrderedDict()
    step = None
    for n, p in engine.module.named_parameters():
        if not p.requires_grad:
            continue
        m = master.get(id(p), p)
        st = basic.state.get(m, {})
        if id(p) in flat_of:
            m, st = flat_of[id(p)]
        gathered[n] = {"fp32": m.detach().clone().float(), "exp_avg": _plain(st.get("exp_avg")),
                       "exp_avg_sq": _plain(st.get("exp_avg_sq"))}
        if step is None:
            step = _plain(st.get("step"))
    snap["gathered"] = gathered
    if dist.get_rank() == 0:
        snap["lp"] = collections.OrderedDict((k, v.detach().clone()) for k, v in engine.module_state_dict().items())
    snap["parts"] = [{"step": step}]
    return snap


def worker(spec_path):
    import torch
    import torch.distributed as dist
    import deepspeed
    with open(spec_path) as f:
        spec = json.load(f)
    m = fixture()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == spec["world"], (world, spec["world"])
    model = m.build_model()
    if spec.get("perturb_frozen"):
        # frozen weights that differ from a fresh model's, so a load that does not restore them is caught
        with torch.no_grad():
            model.frozen.weight.add_(0.25)
    groups = [{"params": [p for _, p in ps], "weight_decay": wd} for _, wd, ps in m.param_groups_spec(model)]
    if spec.get("one_group"):
        groups = [{"params": [p for g in groups for p in g["params"]], "weight_decay": 0.1}]
    if spec["dtype"] == "fp16":
        # DeepSpeed 0.19.8 refuses fp16 on a CPU without AVX512-FP16 (cpu_accelerator.is_fp16_supported is
        # torch.ops.mkldnn._is_mkldnn_fp16_supported()); torch's CPU fp16 kernels run it (as the fixture s0w2_fp16)
        from deepspeed.accelerator import get_accelerator
        get_accelerator().is_fp16_supported = lambda: True
    if spec.get("nvme"):
        import deepspeed.runtime.swap_tensor.optimizer_utils as swap_utils
        swap_utils.MIN_AIO_BYTES = spec.get("nvme_min_bytes", NVME_MIN_AIO_BYTES)
    cfg = make_config(spec["stage"], world, spec["dtype"], spec.get("sub_group_size"), spec.get("universal", False),
                      spec.get("nvme"), spec.get("fused_adam", False),
                      spec.get("nvme_min_bytes", NVME_MIN_AIO_BYTES))
    cfg.update(spec.get("top", {}))   # e.g. data_types.grad_accum_dtype fp32: BF16_Optimizer
    if spec.get("no_scheduler"):      # a checkpoint with no lr scheduler state (one converted from torch DCP)
        cfg.pop("scheduler", None)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    res = {"spec": spec}
    if spec["mode"] == "train":
        res["losses_before"] = train_steps(engine, spec["steps"])
        engine.save_checkpoint(spec["save_dir"])
    else:
        path, _ = engine.load_checkpoint(spec["load_dir"])
        if path is None:
            raise RuntimeError(f"load_checkpoint({spec['load_dir']}) returned None")
    res["snap"] = snapshot(engine, spec["stage"])
    res["losses"] = train_steps(engine, spec["more"])
    torch.save(res, f"{spec['out']}.rank{rank}.pt")
    dist.barrier()


# One DeepSpeed run of a few steps takes seconds; its ops are built beforehand
# (scripts/interop_env.sh), so this is a hang guard, not a build allowance.
RUN_TIMEOUT_S = 400


class RunFailed(Exception):
    pass


def run(tmp, name, world, **spec):
    """Launch `world` workers with `spec`; return the per-rank results. Raises RunFailed with the error."""
    import torch
    spec = dict(spec, world=world, out=os.path.join(tmp, name))
    err = launch_spec(__file__, "--worker", os.path.join(tmp, name + ".json"), spec, world,
                      os.path.join(tmp, name + ".log"), RUN_TIMEOUT_S)
    if err:
        raise RunFailed(err)
    return [torch.load(f"{spec['out']}.rank{r}.pt", weights_only=False) for r in range(world)]


def launch_spec(script, flag, spec_path, spec, world, logs, timeout):
    """Writes spec (JSON) to spec_path and runs `script flag spec_path` on `world` ranks (ds_launch, which also
    removes the /dev/shm buffers DeepSpeed's CPU all-reduce leaves), rank r logging to <logs>.rank<r>.log.
    Returns None, or why it failed: the exit code and the first rank's error."""
    from ds_launch import launch, TIMED_OUT
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    rc = launch(world, [os.path.abspath(script), flag, spec_path], log_prefix=logs, timeout=timeout)
    if rc == 0:
        return None
    why = {-9: " (SIGKILL: out of memory?)", -11: " (SIGSEGV)",
           TIMED_OUT: f" (timed out after {timeout} s)"}.get(rc, "")
    return f"exit {rc}{why}: {error_of(logs, world)}"


def error_of(logs, world):
    """The last exception line of the first rank log that has one (else the log tails)."""
    tails = []
    for r in range(world):
        try:
            with open(f"{logs}.rank{r}.log") as f:
                lines = [ln.rstrip() for ln in f]
        except OSError:
            continue
        lines = [re.sub(r"^\[rank\d+\]: ", "", ln) for ln in lines]
        for i in range(len(lines) - 1, -1, -1):
            if lines[i] and not lines[i].startswith(" ") and ("Error" in lines[i] or "Exception" in lines[i]):
                where = [ln.strip() for ln in lines[:i] if ln.strip().startswith("File ")][-1:]
                return f"rank {r}: {lines[i]}" + (f" (at {where[0]})" if where else "")
        tails.append(f"rank {r}: " + " | ".join(lines[-3:]))
    return "; ".join(tails) or "no logs"


def ds_to_universal(tag_dir, out_dir, log):
    """DeepSpeed's own converter (python -m deepspeed.checkpoint.ds_to_universal). Returns None or the error."""
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", tag_dir,
           "--output_folder", out_dir, "--inject_missing_state", "--num_extract_workers", "1",
           "--num_merge_workers", "1"]
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode == 0:
        return None
    with open(log) as f:
        lines = [ln.rstrip() for ln in f if ln.strip()]
    return lines[-1] if lines else f"exit {r.returncode}"


# ---- what the interop scripts share besides the runs: the zckpt binary, the committed fixtures,
# comparisons, reporting

SRC = os.path.dirname(os.path.dirname(HERE))
ZCKPT = os.environ.get("ZCK_BIN") or os.path.join(SRC, "build", "bin", "zckpt")
FIXTURES = os.environ.get("ZCK_FIXTURES") or os.path.join(SRC, "tests", "fixtures")


def zckpt(*args):
    """Runs `zckpt ARGS...`: None when it succeeds, else its message (or exit code)."""
    r = subprocess.run([ZCKPT, *args], capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")


def fixture_checkpoints(kind="deepspeed"):
    """[(case, its ckpt folder)] of the committed cases under tests/fixtures/<kind>, by name."""
    root = os.path.join(FIXTURES, kind)
    return [(c, os.path.join(root, c, "ckpt")) for c in sorted(os.listdir(root))
            if os.path.isdir(os.path.join(root, c, "ckpt"))]


def same(a, b):
    """Tensors of one dtype and shape with equal values (torch.equal)."""
    import torch
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
            and a.shape == b.shape and torch.equal(a, b))


def bits_equal(a, b):
    """Tensors of one dtype and shape with the same bytes (NaN payloads and -0.0 count)."""
    import torch
    return a.dtype == b.dtype and a.shape == b.shape and a.reshape(-1).view(torch.uint8).equal(
        b.reshape(-1).view(torch.uint8))


def same_obj(x, y):
    """Two torch.load'ed objects equal throughout, tensors bit for bit."""
    import torch
    if torch.is_tensor(x):
        return torch.is_tensor(y) and bits_equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and list(x) == list(y) and all(same_obj(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return type(x) == type(y) and len(x) == len(y) and all(same_obj(u, v) for u, v in zip(x, y))
    if type(x).__module__.startswith("deepspeed"):  # LossScaler & co. have no __eq__
        return type(x) == type(y) and vars(x) == vars(y)
    return x == y


def group_settings_problems(got, want, who):
    """Every param group's settings (lr, betas, eps, weight_decay, ...) against `who`'s. A list and a tuple of
    the same values are equal: betas are a list in DeepSpeed's groups (its JSON config), a tuple in torch's."""
    def seq(x):
        return list(x) if isinstance(x, (list, tuple)) else x
    probs = []
    for g, w in enumerate(want):
        have = got[g] if g < len(got) else {}
        for k, v in w.items():
            if seq(have.get(k)) != seq(v):
                probs.append(f"param group {g}: {k} = {have.get(k)!r}, {who}'s {v!r}")
    if len(got) != len(want):
        probs.append(f"{len(got)} param groups, {who} had {len(want)}")
    return probs


def run_scenarios(scenarios, prefix, only=()):
    """Runs each (name, scenario) that `only` (when given) names, as scenario(tmp) -> [(label, problems)], in one
    temporary folder, and prints `ok   LABEL`, or `FAIL LABEL` and its problems, for each. A scenario that raises
    (a DeepSpeed run that failed) is one failure, its traceback printed, and the others go on. Prints
    `N passed, M failed`; returns the exit code."""
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        for name, scenario in scenarios:
            if only and name not in only:
                continue
            try:
                results = scenario(tmp)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                results = [(name, [f"{type(e).__name__}: {e}"])]
            for label, probs in results:
                if probs:
                    failed += 1
                    print(f"FAIL {label}")
                    for p in probs:
                        print(f"     {p}")
                else:
                    passed += 1
                    print(f"ok   {label}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def run_cases(cases, prefix, shown=40, skipped=0):
    """Runs each (label, check) as check(tmp) -> (problems, notes) in a temporary folder of its own, kept (and
    named) when it fails. A failed DeepSpeed run or any exception is that case's failure, and the others go on.
    Prints `N passed, M failed[, K skipped]`; returns the exit code (0: all passed, and one at least)."""
    passed = failed = 0
    for label, check in cases:
        tmp = tempfile.mkdtemp(prefix=prefix)
        try:
            probs, notes = check(tmp)
        except RunFailed as e:
            probs, notes = [f"a DeepSpeed run failed: {e}"], []
        except Exception:  # noqa: BLE001
            probs, notes = ["harness error:\n" + traceback.format_exc()], []
        if probs:
            failed += 1
            print(f"FAIL {label}")
            for p in probs[:shown]:
                print(f"    {p}")
            if len(probs) > shown:
                print(f"    ... {len(probs) - shown} more")
            print(f"    (kept {tmp})")
        else:
            passed += 1
            shutil.rmtree(tmp, ignore_errors=True)
            print(f"ok   {label}")
        for n in notes:
            print(f"    {n}")
        sys.stdout.flush()
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 0 if failed == 0 and passed > 0 else 1


class Failures(list):
    """fail = Failures(); fail("why") records and prints `FAIL why`; `if fail:` after the checks."""
    def __call__(self, msg):
        self.append(msg)
        print("FAIL", msg)


@contextlib.contextmanager
def scratch(prefix):
    """A temporary folder, removed afterwards unless ZCK_KEEP_TMP is set (then its path is printed)."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        yield tmp
    finally:
        if os.environ.get("ZCK_KEEP_TMP"):
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        end_worker()
    else:
        sys.exit("usage: ds_harness.py --worker SPEC.json (launched by interop_reshard.py)")
