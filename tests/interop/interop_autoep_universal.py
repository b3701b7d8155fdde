"""interop_autoep_universal.py: `zckpt to-universal` of DeepSpeed AutoEP (expert-parallel MoE) checkpoints against
DeepSpeed 0.19.8's own ds_to_universal.py, run live on the fixtures of tests/fixtures/autoep (ZeRO-2 and ZeRO-3,
fp32 and bf16, Mixtral and Qwen3-MoE, EP 2 on 2 ranks and EP 2 x expert-data-parallel 2 on 4).

Per case:
  same files    the same file set (zckpt adds zckpt-manifest.json) and the same latest_universal;
  same content  every .pt equal: the same dict keys in the same order, tensors of the same dtype, shape and bytes,
                equal Python values. That covers what DeepSpeed does on its own there: each expert weight one
                folder zero/<prefix>.w{1,2,3}/ holding all experts ({'param', 'cat_dim', 'is_expert_param',
                'ep_num_experts'}), at ZeRO-3 too; the router alias mlp.gate.gate.weight written at ZeRO-2 from the
                module's 16-bit copy (fp32.pt only) and not at all at ZeRO-3; the model-states files saved again
                with universal_checkpoint_info's expert_parameter_patterns and ds_autoep_layers set as DeepSpeed's
                universal loader reads them.
  read back     zckpt reads both folders (zckpt's and DeepSpeed's) as the AutoEP checkpoint under DeepSpeed's names
                (the router alias is the router, not written again; each expert param whole): `zckpt consolidate` ==
                the live engine's fp32 masters (expected_fp32) bit for bit, `--dtype bf16` of the bf16 cases == its
                16-bit weights (expected_lp); `zckpt verify` clean on zckpt's folder.
  hdf5          `to-universal --format hdf5` (the one-file container): every dataset of /params equal to the
                tensor of DeepSpeed's folder under that name (fp32, exp_avg, exp_avg_sq: dtype, shape, bytes; read
                with h5py), the same params (the folder's router alias aside), the source's ds_autoep_layers in its
                autoep_layers attribute; read back by zckpt: consolidate == the live engine's fp32 masters, verify
                clean.
  refusals      reshard (DeepSpeed or DCP) of the universal folder and of the container refused in one line (it
                would not write AutoEP's layout), nothing written.

Prints `N passed, M failed`; exits 0 only if all pass (77 without a zckpt binary or the fixtures).
"""
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import h5py  # noqa: E402
import hdf5plugin  # noqa: E402,F401  (the container's zstd filter)
import numpy as np  # noqa: E402
import torch  # noqa: E402

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(SRC, "tests", "fixtures", "autoep")
ZCKPT = os.environ.get("ZCK_BIN") or os.path.join(SRC, "build", "bin", "zckpt")
CASES = ["ep2_s2_fp32", "ep2_s2_bf16", "ep2_s3_fp32", "ep2_s3_sg600_fp32", "ep2_s3_bf16", "qwen3_ep2_s2_bf16", "ep2dp2_s2_fp32", "ep2dp2_s3_fp32"]

passed, failed = 0, 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def same(a, b, path, errs):
    """Equal as values: tensors by dtype, shape and bytes; dicts with their key order."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        if not (torch.is_tensor(a) and torch.is_tensor(b)):
            errs.append(f"{path}: tensor vs {type(b).__name__}")
        elif a.dtype != b.dtype or a.shape != b.shape:
            errs.append(f"{path}: {a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)}")
        elif a.numel() and not torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)):
            errs.append(f"{path}: values differ")
        return
    if type(a) is not type(b):
        errs.append(f"{path}: {type(a).__name__} vs {type(b).__name__}")
    elif isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            errs.append(f"{path}: keys {list(a.keys())} vs {list(b.keys())}")
        else:
            for k in a:
                same(a[k], b[k], f"{path}.{k}", errs)
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            errs.append(f"{path}: length {len(a)} vs {len(b)}")
        else:
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{path}[{i}]", errs)
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        same(vars(a), vars(b), f"{path}.__dict__", errs)
    elif isinstance(a, float) and a != a:
        if b == b:
            errs.append(f"{path}: nan vs {b}")
    elif a != b:
        errs.append(f"{path}: {a!r} vs {b!r}")


def refused(cmd, out, what):
    r = subprocess.run([ZCKPT, *cmd], capture_output=True, text=True)
    check(r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "AutoEP" in r.stderr
          and not os.path.exists(out), f"{what} not refused in one line: rc {r.returncode} {r.stderr!r}")


def check_h5(case, ckpt, ref, want, tmp):
    """zckpt's container against DeepSpeed's universal folder `ref`, then read back by zckpt."""
    from safetensors.torch import load_file
    h5 = os.path.join(tmp, case, "uc.h5")
    z = subprocess.run([ZCKPT, "to-universal", "-q", "--format", "hdf5", ckpt, h5], capture_output=True, text=True)
    check(z.returncode == 0, f"{case}: to-universal --format hdf5: {z.stderr.strip()}")
    if z.returncode:
        return
    errs = []
    with h5py.File(h5, "r") as f:
        names = json.loads(f.attrs["param_names"])
        layers = json.loads(f.attrs["autoep_layers"]) if "autoep_layers" in f.attrs else None
        src = torch.load(os.path.join(ckpt, open(os.path.join(ckpt, "latest")).read().strip(),
                                      "mp_rank_00_model_states.pt" if "_s3_" not in case else
                                      "zero_pp_rank_0_mp_rank_00_model_states.pt"), weights_only=False)
        if layers != json.loads(json.dumps(src["ds_autoep_layers"])):
            errs.append(f"autoep_layers {layers} vs the source's {src['ds_autoep_layers']}")
        folders = sorted(n for n in os.listdir(os.path.join(ref, "zero")) if os.path.isdir(os.path.join(ref, "zero", n)))
        alias = [n for n in folders if n.endswith(".gate.gate.weight")]
        if sorted(names) != sorted(set(folders) - set(alias)):
            errs.append(f"params: only container {sorted(set(names) - set(folders))}, only folder "
                        f"{sorted(set(folders) - set(names) - set(alias))}")
        for n in names:
            for part in ("fp32", "exp_avg", "exp_avg_sq"):
                t = torch.load(os.path.join(ref, "zero", n, part + ".pt"), weights_only=False)
                t = t["param"] if isinstance(t, dict) else t   # ZeRO-3's non-expert files: the flat tensor alone
                d = f[f"params/{n}/{part}"]
                a = np.ascontiguousarray(d[()])
                if d.attrs["dtype"] != str(t.dtype).replace("torch.", "") or a.size != t.numel():
                    errs.append(f"{n}/{part}: {d.attrs['dtype']} {a.shape} vs {t.dtype} {tuple(t.shape)}")
                elif a.tobytes() != t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes():
                    errs.append(f"{n}/{part}: values differ")
    check(not errs, f"{case}: the container differs from DeepSpeed's universal folder: " + "; ".join(errs[:8]))
    out = os.path.join(tmp, case, "h5_fp32.safetensors")
    r = subprocess.run([ZCKPT, "consolidate", "-q", h5, out], capture_output=True, text=True)
    check(r.returncode == 0, f"{case}: consolidate of the container: {r.stderr.strip()}")
    if r.returncode == 0:
        got = load_file(out)
        bad = [k for k in want if k not in got or not torch.equal(got[k], want[k])]
        check(set(got) == set(want) and not bad, f"{case}: consolidate of the container differs from the live "
                                                 f"engine's: keys {sorted(set(got) ^ set(want))}, values {bad[:4]}")
    r = subprocess.run([ZCKPT, "verify", h5], capture_output=True, text=True)
    check(r.returncode == 0, f"{case}: verify of the container: {r.stdout[-600:]} {r.stderr.strip()}")
    for job in (["reshard", "--to-world-size", "1"], ["reshard", "--to-format", "dcp"]):
        res = os.path.join(tmp, case, "h5_resharded")
        refused([*job, h5, res], res, f"{case}: {' '.join(job)} of the container")


def files_under(d):
    return sorted(os.path.relpath(os.path.join(dp, f), d) for dp, _, fs in os.walk(d) for f in fs)


if not os.path.exists(ZCKPT) or not os.path.isdir(FIX):
    print("SKIP: no zckpt binary or no AutoEP fixtures")
    sys.exit(77)

with tempfile.TemporaryDirectory() as tmp:
    for case in CASES:
        ckpt = os.path.join(FIX, case, "ckpt")
        tag = open(os.path.join(ckpt, "latest")).read().strip()
        ref, ours = os.path.join(tmp, case, "ref", "uc"), os.path.join(tmp, case, "ours", "uc")
        os.makedirs(os.path.dirname(ref))
        os.makedirs(os.path.dirname(ours))
        r = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                            os.path.join(ckpt, tag), "--output_folder", ref, "--num_extract_workers", "1",
                            "--num_merge_workers", "1"], capture_output=True, text=True)
        check(r.returncode == 0, f"{case}: ds_to_universal failed: {(r.stdout + r.stderr)[-1500:]}")
        z = subprocess.run([ZCKPT, "to-universal", "-q", ckpt, ours], capture_output=True, text=True)
        check(z.returncode == 0, f"{case}: zckpt to-universal failed: {z.stderr.strip()}")
        if r.returncode or z.returncode:
            continue
        fa, fb = files_under(ref), [f for f in files_under(ours) if f != "zckpt-manifest.json"]
        check(fa == fb, f"{case}: file sets differ: only DeepSpeed {sorted(set(fa) - set(fb))}, "
                        f"only zckpt {sorted(set(fb) - set(fa))}")
        la = open(os.path.join(os.path.dirname(ref), "latest_universal")).read()
        lb = open(os.path.join(os.path.dirname(ours), "latest_universal")).read()
        check(la == lb, f"{case}: latest_universal {la!r} vs {lb!r}")
        errs = []
        for f in sorted(set(fa) & set(fb)):
            if f.endswith(".pt"):
                same(torch.load(os.path.join(ref, f), weights_only=False),
                     torch.load(os.path.join(ours, f), weights_only=False), f, errs)
        check(not errs, f"{case}: content differs: " + "; ".join(errs[:8]))
        # read back: consolidate of both folders = the live engine's masters (and 16-bit weights)
        from safetensors.torch import load_file
        want = load_file(os.path.join(FIX, case, "expected_fp32.safetensors"))
        want_lp = load_file(os.path.join(FIX, case, "expected_lp.safetensors"))
        lp = "bf16" if want_lp[next(iter(want_lp))].dtype == torch.bfloat16 else None
        for who, d in (("zckpt", ours), ("DeepSpeed", ref)):
            for dtype, expect in ((None, want), (lp, want_lp)) if lp else ((None, want),):
                out = os.path.join(tmp, case, f"{who}_{dtype or 'fp32'}.safetensors")
                r = subprocess.run([ZCKPT, "consolidate", "-q", *(["--dtype", dtype] if dtype else []), d, out],
                                   capture_output=True, text=True)
                check(r.returncode == 0, f"{case}: consolidate of {who}'s universal folder: {r.stderr.strip()}")
                if r.returncode:
                    continue
                got = load_file(out)
                bad = [k for k in expect if k not in got or got[k].dtype != expect[k].dtype
                       or not torch.equal(got[k], expect[k])]
                check(set(got) == set(expect) and not bad,
                      f"{case}: consolidate ({dtype or 'fp32'}) of {who}'s universal folder differs from the live "
                      f"engine's: keys {sorted(set(got) ^ set(expect))}, values {bad[:4]}")
        r = subprocess.run([ZCKPT, "verify", ours], capture_output=True, text=True)
        check(r.returncode == 0, f"{case}: verify of zckpt's universal folder: {r.stdout[-600:]} {r.stderr.strip()}")
        for job in (["reshard", "--to-world-size", "1"], ["reshard", "--to-format", "dcp"]):
            out = os.path.join(tmp, case, "resharded")
            r = subprocess.run([ZCKPT, *job, ours, out], capture_output=True, text=True)
            check(r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "AutoEP" in r.stderr
                  and not os.path.exists(out), f"{case}: {' '.join(job)} of the universal folder not refused in one "
                                               f"line: rc {r.returncode} {r.stderr!r}")
        check_h5(case, ckpt, ref, want, tmp)
        experts = [f for f in fa if ".experts.w" in f]
        print(f"{case}: {len(fa)} files equal to ds_to_universal's ({len(experts)} of the experts); both read back")


print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
