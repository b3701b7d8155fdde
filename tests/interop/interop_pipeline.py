"""interop_pipeline.py: DeepSpeed PipelineModule checkpoints (layer_<XX>-model_states.pt beside one mp_rank_<stage>
file set per pipeline stage) through zckpt, checked against DeepSpeed itself.

Sources: tests/fixtures/deepspeed-moe/pipe_* (DeepSpeed 0.19.8 on the CPU, made by
tests/fixtures/gen/make_legacy_moe_fixtures.py): pipe_pp2_s1 (2 stages x dp 1, fp32) and pipe_pp2_dp2_bf16 (2 stages
x dp 2, bf16); tests/fixtures/deepspeed-pipe/pipe_tied_* (make_pipe_tied_fixtures.py): the same two layouts with a
TiedLayerSpec weight in both stages (tied_modules.embed.weight, once in the outputs). zero_to_fp32.py reads none
(`module` is None). Per case:
    verify        clean, every layer file among the files checked
    consolidate   == the live engine's gathered fp32 masters (expected_fp32) bit for bit, under the module's names
                  ("<layer>.<key>"); --dtype bf16 == those masters cast by torch
    to-universal  --inject-missing-state == DeepSpeed's ds_to_universal.py --inject_missing_state of the same folder,
                  file for file (run with one extract worker, as ds_harness runs it: with several, it fails on
                  pipe_tied_pp2_dp2_bf16, see tests/fixtures/deepspeed-pipe/README.md), and its fp32 / exp_avg /
                  exp_avg_sq == the live engine's (expected_fp32 / expected_state);
                  ds_to_universal.py's folder read back: consolidate == the pipeline's byte for byte, verify clean
    reshard       --to-stage 2 refused in one line naming the layout, nothing written (PipelineEngine takes ZeRO-1 at
                  most; another dp size: interop_pipeline_reshard.py)
    damage        a layer file of another save (its records intact, other values, saved by torch under the same
                  name): verify names it and exits non-zero; consolidate still reads the masters. With a tied
                  weight, stage 1's copy made unequal to stage 0's: verify names the stage file and the element
Prints `N passed, M failed`; exits 0 only if all pass (77 without a zckpt binary or the fixtures).
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import ds_harness as H  # noqa: E402

# case -> its fixture folder
ROOTS = {"pipe_pp2_s1": "deepspeed-moe", "pipe_pp2_dp2_bf16": "deepspeed-moe",
         "pipe_tied_pp2_s1": "deepspeed-pipe", "pipe_tied_pp2_dp2_bf16": "deepspeed-pipe"}
CASES = [c for c, r in ROOTS.items() if os.path.isdir(os.path.join(H.FIXTURES, r, c))]


def run(*args):
    return subprocess.run([H.ZCKPT, *args], capture_output=True, text=True)


def files(p):
    return sorted(os.path.relpath(os.path.join(dp, f), p) for dp, _, fs in os.walk(p) for f in fs
                  if f != "zckpt-manifest.json")


def check(case, tmp, fails):
    import torch
    from safetensors.torch import load_file
    FIX = os.path.join(H.FIXTURES, ROOTS[case])
    ckpt = os.path.join(FIX, case, "ckpt")
    tag = os.path.join(ckpt, "global_step2")
    exp = load_file(os.path.join(FIX, case, "expected_fp32.safetensors"))
    n_files = len(os.listdir(tag))
    r = run("verify", ckpt)
    if r.returncode or "result: clean" not in r.stdout or f"checked: {n_files} files" not in r.stdout:
        fails.append(f"verify: {r.stdout[-300:]} {r.stderr[-300:]}")
    for dtype in ("fp32", "bf16"):
        out = os.path.join(tmp, f"{case}-{dtype}.safetensors")
        r = run("consolidate", "-q", "--dtype", dtype, ckpt, out)
        if r.returncode:
            fails.append(f"consolidate --dtype {dtype}: {r.stderr.strip()}")
            continue
        got = load_file(out)
        want = {k: v if dtype == "fp32" else v.to(torch.bfloat16) for k, v in exp.items()}
        bad = sorted(set(got) ^ set(want)) or [k for k in want if not H.bits_equal(got[k], want[k])]
        if bad:
            fails.append(f"consolidate --dtype {dtype} differs from the live engine's masters: {bad[:4]}")
    ours, theirs = os.path.join(tmp, case + "-zu"), os.path.join(tmp, case + "-du")
    r = run("to-universal", "-q", "--inject-missing-state", ckpt, ours)
    err = H.ds_to_universal(tag, theirs, os.path.join(tmp, case + "-du.log"))
    if r.returncode or err:
        fails.append(f"to-universal: {r.stderr.strip()} / ds_to_universal: {err}")
        return
    if files(ours) != files(theirs):
        fails.append(f"universal files differ: {sorted(set(files(ours)) ^ set(files(theirs)))}")
        return
    load = lambda p: torch.load(p, map_location="cpu", weights_only=False)  # noqa: E731
    bad = [f for f in files(theirs) if not H.same_obj(load(os.path.join(ours, f)), load(os.path.join(theirs, f)))]
    if bad:
        fails.append(f"universal files differ from ds_to_universal's: {bad[:4]}")
    for name, t in exp.items():
        if not H.bits_equal(load(os.path.join(ours, "zero", name, "fp32.pt"))["param"], t):
            fails.append(f"universal {name}/fp32 differs from the live engine's")
    for key, t in load_file(os.path.join(FIX, case, "expected_state.safetensors")).items():
        name, st = key.rsplit("/", 1)
        if not H.bits_equal(load(os.path.join(ours, "zero", name, st + ".pt"))["param"], t):
            fails.append(f"universal {name}/{st} differs from the live engine's")
    # ds_to_universal.py's folder read back: consolidate == the pipeline's, byte for byte; verify clean
    for dtype in ("fp32", "bf16"):
        out = os.path.join(tmp, f"{case}-du-{dtype}.safetensors")
        r = run("consolidate", "-q", "--dtype", dtype, theirs, out)
        with open(out if not r.returncode else os.devnull, "rb") as a, \
                open(os.path.join(tmp, f"{case}-{dtype}.safetensors"), "rb") as b:
            if r.returncode or a.read() != b.read():
                fails.append(f"consolidate --dtype {dtype} of ds_to_universal's folder: {r.stderr.strip()[-300:]}")
    r = run("verify", theirs)
    if r.returncode or "result: clean" not in r.stdout:
        fails.append(f"verify of ds_to_universal's folder: {r.stdout[-300:]} {r.stderr[-300:]}")
    out = os.path.join(tmp, case + "-reshard")
    r = run("reshard", "--to-stage", "2", ckpt, out)
    if r.returncode != 1 or "PipelineModule" not in r.stderr or len(r.stderr.strip().splitlines()) != 1 or \
            os.path.exists(out):
        fails.append(f"reshard should refuse in one line: rc {r.returncode} {r.stderr.strip()}")
    other = os.path.join(tmp, case + "-other")
    shutil.copytree(ckpt, other)
    layer = os.path.join(other, "global_step2", "layer_00-model_states.pt")
    sd = torch.load(layer)
    sd["weight"] = sd["weight"] * 2  # what an earlier step's file would hold: the same records, other values
    torch.save(sd, layer)
    r = run("verify", other)
    damaged = [ln for ln in r.stdout.splitlines() if ln.startswith("damaged:")]
    if r.returncode == 0 or len(damaged) != 1 or "layer_00-model_states.pt" not in damaged[0]:
        fails.append(f"verify of a layer file of another save: rc {r.returncode} {r.stdout[-300:]}")
    if "tied" not in case:
        return
    # a later stage's copy of the tied weight that is not the first stage's (a stage file of another save): verify
    # names the file; DeepSpeed keeps the copies equal (their grads are all-reduced)
    stale = os.path.join(tmp, case + "-stale")
    shutil.copytree(ckpt, stale)
    f = [n for n in os.listdir(os.path.join(stale, "global_step2"))
         if n.endswith("zero_pp_rank_0_mp_rank_01_optim_states.pt")][0]
    path = os.path.join(stale, "global_step2", f)
    sd = torch.load(path, weights_only=False)
    with torch.no_grad():
        sd["optimizer_state_dict"]["single_partition_of_fp32_groups"][0][5] += 1e-3  # the copy comes first
    torch.save(sd, path)
    r = run("verify", stale)
    damaged = [ln for ln in r.stdout.splitlines() if ln.startswith("damaged:")]
    if r.returncode == 0 or len(damaged) != 1 or f not in damaged[0] or "element 5 of 'tied_modules.embed.weight'" \
            not in damaged[0]:
        fails.append(f"verify of a stale copy of the tied weight: rc {r.returncode} {r.stdout[-300:]}")


def main():
    if not os.path.exists(H.ZCKPT) or not CASES:
        print("SKIP: no zckpt binary or fixtures")
        return 77
    import torch  # noqa: F401  (the comparisons need it; imported before the tmp folder)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            fails = []
            check(case, tmp, fails)
            for f in fails:
                print("FAIL", case + ":", f)
            print(("ok   " if not fails else "FAIL ") + case)
            passed += not fails
            failed += bool(fails)
    print(f"{passed} passed, {failed} failed")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
