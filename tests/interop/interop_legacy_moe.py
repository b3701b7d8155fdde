"""interop_legacy_moe.py: DeepSpeed's legacy MoE (deepspeed.moe.layer.MoE) and pipeline (PipelineModule) checkpoints
through zckpt, checked against DeepSpeed itself.

Sources: tests/fixtures/deepspeed-moe (the pipeline case is interop_pipeline.py's; DeepSpeed 0.19.8 on the CPU, made by
tests/fixtures/gen/make_legacy_moe_fixtures.py). zero_to_fp32.py reads none of them (checked here), so:

  ep_size 1 (moe_ep1_s2, moe_ep1_s1: experts in a param group of their own, partitioned over every rank, beside
                their layer_<L>_expert_<E> files)
    verify        clean, the expert files among the files checked
    consolidate   == the live engine's gathered fp32 masters (expected_fp32), bit for bit, every expert under its
                  global name; --dtype bf16 == those masters cast by torch
    to-universal  --inject-missing-state == DeepSpeed's own ds_to_universal.py --inject_missing_state of the same
                  folder, file for file (every zero/<param>/<state>.pt, optimizer_state.pt, mp_rank_00), and its
                  exp_avg / exp_avg_sq of the non-expert params == the live engine's (expected_state);
                  ds_to_universal.py's folder read back: consolidate == the checkpoint's byte for byte, verify clean,
                  reshard from it refused (the expert files are written from the DeepSpeed checkpoint only)
    reshard       (interop_legacy_moe_reshard: DeepSpeed loads what it writes); --to-format dcp refused in one line
  ep_size 2 (moe_ep2_s2, moe_ep2_s2_bf16: each rank's expert group holds its own expert under the local name
                deepspeed_experts.0, partition_count 1 of 2)
    verify        clean; inspect lists each expert once under its global name
    consolidate   == the live engine's gathered fp32 masters, every expert under its global name (the names and
                  tensors of the same model at ep_size 1); --dtype bf16 == those masters cast by torch, and (bf16
                  run) == the engine's own 16-bit weights as it saved them (`module` and every rank's expert file)
    to-universal  (ds and hdf5) refused in one line naming ep_size 2, nothing written: ds_to_universal.py fails on
                  it (it merges two ranks' different experts, both named deepspeed_experts.0, as fragments of one
                  param), checked here
    reshard       (interop_legacy_moe_reshard: DeepSpeed loads what it writes)
  no ZeRO (moe_ep2_s0: expp_rank_* optimizer files): every job refuses in one line naming the file and the layout,
                writing nothing.

Prints `N passed, M failed`; exits 0 only if all pass (77 without a zckpt binary or the fixtures).
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
FIX = os.path.join(SRC, "tests", "fixtures", "deepspeed-moe")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, HERE)
import ds_harness as H  # noqa: E402

ZCKPT = H.ZCKPT
READ = ["moe_ep1_s2", "moe_ep1_s1"]
READ_EP = ["moe_ep2_s2", "moe_ep2_s2_bf16"]
REFUSED = {"moe_ep2_s0": ("expp_rank_", "stage 0")}


bits_equal, same_obj = H.bits_equal, H.same_obj


def zckpt(*args):
    return subprocess.run([ZCKPT, *args], capture_output=True, text=True)


def ds_to_universal(tag_dir, out):
    return subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", tag_dir,
                           "--output_folder", out, "--inject_missing_state", "--num_extract_workers", "1",
                           "--num_merge_workers", "1"], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def zero_to_fp32_fails(ckpt, out):
    """DeepSpeed's zero_to_fp32 (the module's own function) on the folder: the error it raises, None if it ran."""
    r = subprocess.run([sys.executable, "-c", "import sys; from deepspeed.utils.zero_to_fp32 import "
                        "convert_zero_checkpoint_to_fp32_state_dict as c; c(sys.argv[1], sys.argv[2])", ckpt, out],
                       capture_output=True, text=True)
    return (r.stderr.strip().splitlines() or ["?"])[-1] if r.returncode else None


def check_consolidate(case, ckpt, exp, tmp, fails):
    """consolidate --dtype fp32 / bf16 == the live engine's gathered masters (cast by torch for bf16)."""
    import torch
    from safetensors.torch import load_file
    for dtype in ("fp32", "bf16"):
        out = os.path.join(tmp, f"{case}-{dtype}.safetensors")
        r = zckpt("consolidate", "-q", "--dtype", dtype, ckpt, out)
        if r.returncode:
            fails.append(f"{case}: consolidate --dtype {dtype}: {r.stderr.strip()}")
            continue
        got = load_file(os.path.join(out, "model.safetensors") if os.path.isdir(out) else out)
        want = {k: v if dtype == "fp32" else v.to(torch.bfloat16) for k, v in exp.items()}
        bad = sorted(set(got) ^ set(want)) or [k for k in want if not bits_equal(got[k], want[k])]
        if bad:
            fails.append(f"{case}: consolidate --dtype {dtype} differs from the live engine's masters: {bad[:4]}")


def check_read_ep(case, tmp, fails):
    """ep_size 2: read as the ep_size 1 model; to-universal refused by name, as ds_to_universal.py fails."""
    from safetensors.torch import load_file
    ckpt = os.path.join(FIX, case, "ckpt")
    exp = load_file(os.path.join(FIX, case, "expected_fp32.safetensors"))
    r = zckpt("verify", ckpt)
    if r.returncode or "result: clean" not in r.stdout or "checked: 5 files" not in r.stdout:
        fails.append(f"{case}: verify: {r.stdout[-300:]} {r.stderr[-300:]}")
    r = zckpt("inspect", ckpt)
    experts = [n for n in exp if ".deepspeed_experts." in n]
    if r.returncode or any(r.stdout.count(n + " ") != 1 for n in experts):
        fails.append(f"{case}: inspect does not list each expert once: {r.stdout[-600:]} {r.stderr[-300:]}")
    check_consolidate(case, ckpt, exp, tmp, fails)
    if case.endswith("_bf16"):
        import torch
        tag = os.path.join(ckpt, "global_step2")
        lp = dict(torch.load(os.path.join(tag, "mp_rank_00_model_states.pt"), weights_only=False)["module"])
        for f in os.listdir(tag):
            if f.startswith("layer_"):
                lp.update(torch.load(os.path.join(tag, f), weights_only=True))
        got = load_file(os.path.join(tmp, f"{case}-bf16.safetensors"))
        bad = sorted(set(got) ^ set(lp)) or [k for k in lp if not bits_equal(got[k], lp[k])]
        if bad:
            fails.append(f"{case}: consolidate --dtype bf16 differs from the engine's saved 16-bit weights: {bad[:4]}")
    for fmt in ("ds", "hdf5"):
        out = os.path.join(tmp, f"{case}-zu-{fmt}")
        r = zckpt("to-universal", "--format", fmt, "--inject-missing-state", ckpt, out)
        lines = r.stderr.strip().splitlines()
        if r.returncode != 1 or len(lines) != 1 or "deepspeed.moe" not in lines[0] or "ep_size 2" not in lines[0] \
                or os.path.exists(out):
            fails.append(f"{case}: to-universal --format {fmt} should refuse in one line naming ep_size 2: "
                         f"rc {r.returncode} {r.stderr.strip()[-300:]}")
    if not ds_to_universal(os.path.join(ckpt, "global_step2"), os.path.join(tmp, case + "-du")).returncode:
        fails.append(f"{case}: ds_to_universal converted it: to-universal should then too")


def check_read(case, tmp, fails):
    import torch
    from safetensors.torch import load_file
    ckpt = os.path.join(FIX, case, "ckpt")
    exp = load_file(os.path.join(FIX, case, "expected_fp32.safetensors"))
    if not zero_to_fp32_fails(ckpt, os.path.join(tmp, case + "-z2f")):
        fails.append(f"{case}: zero_to_fp32 ran (the comparison below is against the live engine because it did not)")
    r = zckpt("verify", ckpt)
    if r.returncode or "result: clean" not in r.stdout or "checked: 5 files" not in r.stdout:
        fails.append(f"{case}: verify: {r.stdout[-300:]} {r.stderr[-300:]}")
    check_consolidate(case, ckpt, exp, tmp, fails)
    ours, theirs = os.path.join(tmp, case + "-zu"), os.path.join(tmp, case + "-du")
    r = zckpt("to-universal", "-q", "--inject-missing-state", ckpt, ours)
    if r.returncode:
        fails.append(f"{case}: to-universal: {r.stderr.strip()}")
        return
    d = ds_to_universal(os.path.join(ckpt, "global_step2"), theirs)
    if d.returncode:
        fails.append(f"{case}: ds_to_universal failed: {d.stderr[-300:]}")
        return
    files = lambda p: sorted(os.path.relpath(os.path.join(dp, f), p) for dp, _, fs in os.walk(p) for f in fs
                             if f != "zckpt-manifest.json")
    if files(ours) != files(theirs):
        fails.append(f"{case}: universal files differ: {sorted(set(files(ours)) ^ set(files(theirs)))}")
        return
    load = lambda p: torch.load(p, map_location="cpu", weights_only=False)
    bad = [f for f in files(theirs) if not same_obj(load(os.path.join(ours, f)), load(os.path.join(theirs, f)))]
    if bad:
        fails.append(f"{case}: universal files differ from ds_to_universal's: {bad[:4]}")
    experts = [n for n in exp if ".deepspeed_experts." in n]
    if len(experts) != 4 or any(not os.path.isdir(os.path.join(ours, "zero", n)) for n in experts):
        fails.append(f"{case}: the experts' universal folders: {experts}")
    state = load_file(os.path.join(FIX, case, "expected_state.safetensors"))
    for key, t in state.items():
        name, st = key.rsplit("/", 1)
        if not bits_equal(load(os.path.join(ours, "zero", name, st + ".pt"))["param"], t):
            fails.append(f"{case}: universal {name}/{st} differs from the live engine's")
    # ds_to_universal.py's folder read back (its experts from zero/): consolidate == the checkpoint's, byte for byte
    for dtype in ("fp32", "bf16"):
        out = os.path.join(tmp, f"{case}-du-{dtype}.safetensors")
        r = zckpt("consolidate", "-q", "--dtype", dtype, theirs, out)
        mine = os.path.join(tmp, f"{case}-{dtype}.safetensors")
        one = lambda p: os.path.join(p, "model.safetensors") if os.path.isdir(p) else p  # noqa: E731
        with open(one(out) if not r.returncode else os.devnull, "rb") as a, open(one(mine), "rb") as b:
            if r.returncode or a.read() != b.read():
                fails.append(f"{case}: consolidate --dtype {dtype} of ds_to_universal's folder: {r.stderr.strip()[-300:]}")
    r = zckpt("verify", theirs)
    if r.returncode or "result: clean" not in r.stdout:
        fails.append(f"{case}: verify of ds_to_universal's folder: {r.stdout[-300:]} {r.stderr[-300:]}")
    r = zckpt("reshard", "--to-world-size", "1", theirs, os.path.join(tmp, case + "-du-reshard"))
    if r.returncode != 1 or "deepspeed.moe" not in r.stderr or os.path.exists(os.path.join(tmp, case + "-du-reshard")):
        fails.append(f"{case}: reshard from the universal folder should refuse: rc {r.returncode} {r.stderr.strip()}")
    r = zckpt("reshard", "--to-format", "dcp", "--to-world-size", "1", ckpt, os.path.join(tmp, case + "-reshard"))
    if r.returncode != 1 or "deepspeed.moe" not in r.stderr or len(r.stderr.strip().splitlines()) != 1 or \
            os.path.exists(os.path.join(tmp, case + "-reshard")):
        fails.append(f"{case}: reshard --to-format dcp should refuse in one line: rc {r.returncode} {r.stderr.strip()}")


def check_refused(case, tmp, fails):
    ckpt = os.path.join(FIX, case, "ckpt")
    fname, why = REFUSED[case]
    for job in (["inspect", ckpt], ["verify", ckpt], ["consolidate", ckpt, os.path.join(tmp, case + ".safetensors")],
                ["to-universal", "--inject-missing-state", ckpt, os.path.join(tmp, case + "-zu")]):
        r = zckpt(*job)
        lines = r.stderr.strip().splitlines()
        if r.returncode != 1 or len(lines) != 1 or fname not in lines[0] or why not in lines[0]:
            fails.append(f"{case}: {job[0]} should refuse in one line naming {fname} and '{why}': rc {r.returncode} "
                         f"{r.stderr.strip()[-300:]}")
        if len(job) > 2 and os.path.exists(job[-1]):
            fails.append(f"{case}: {job[0]} left {job[-1]}")


def main():
    if not os.path.exists(ZCKPT) or not os.path.isdir(FIX):
        print("SKIP: no zckpt binary or fixtures")
        return 77
    import torch  # noqa: F401  (the comparisons need it; imported before the tmp folder)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in READ + READ_EP + list(REFUSED):
            fails = []
            (check_read if case in READ else check_read_ep if case in READ_EP else check_refused)(case, tmp, fails)
            for f in fails:
                print("FAIL", f)
            print(("ok   " if not fails else "FAIL ") + case)
            passed += not fails
            failed += bool(fails)
    print(f"{passed} passed, {failed} failed")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
