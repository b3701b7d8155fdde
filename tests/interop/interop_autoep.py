"""interop_autoep.py: DeepSpeed's AutoEP (expert-parallel MoE) checkpoints through zckpt, against DeepSpeed itself
and transformers.

Sources: the real AutoEP checkpoints of tests/fixtures/autoep (DeepSpeed 0.19.8 on the CPU, a tiny HF Mixtral,
4 experts over EP 2 on 2 ranks, ZeRO-2 and ZeRO-3, fp32 and bf16, a Qwen3-MoE at ZeRO-2 bf16, and EP 2 x
expert-data-parallel 2 on 4 ranks at ZeRO-2 and ZeRO-3; made by
tests/fixtures/gen/make_autoep_fixtures.py). Per case:

  consolidate   `zckpt consolidate` == the live engine's fp32 masters (expected_fp32: safe_get_full_fp32_param on
                every rank, expert params concatenated over the EP group), bit for bit, under the HF model's names:
                gate_up_proj = per expert w1's rows then w3's (HF's forward chunks gate, up, as transformers' own
                conversion of the per-expert w1 / w3 names does), down_proj = w2, mlp.gate.weight = DeepSpeed's
                mlp.router.gate.weight (its alias mlp.gate.gate.weight, the same tensor, is not written again).
  bf16          `--dtype bf16` of the bf16 cases == the engine's own 16-bit module weights (expected_lp), bit for bit.
  from_pretrained  AutoModelForCausalLM.from_pretrained (Mixtral / Qwen3-MoE) of the consolidated folder (with the fixture's config.json)
                loads with no missing, unexpected or mismatched keys, and its weights are the consolidated tensors.
  inspect / verify  exit 0.

Prints `N passed, M failed`; exits 0 only if all pass (77 without a zckpt binary or the fixtures).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(SRC, "tests", "fixtures", "autoep")
ZCKPT = os.environ.get("ZCK_BIN") or os.path.join(SRC, "build", "bin", "zckpt")
CASES = ["ep2_s1_fp32", "ep2_s3_sg600_fp32", "ep2_s2_fp32", "ep2_s2_bf16", "ep2_s3_fp32", "ep2_s3_bf16", "qwen3_ep2_s2_bf16", "ep2dp2_s2_fp32", "ep2dp2_s3_fp32"]

passed, failed = 0, 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def zckpt(*args):
    return subprocess.run([ZCKPT, *args], capture_output=True, text=True)


def hf_names(ds):
    """DeepSpeed's AutoEP names and shapes -> the HF Mixtral's."""
    import torch
    out = {}
    for k, v in ds.items():
        if k.endswith(".experts.w1"):
            out[k[:-3] + ".gate_up_proj"] = torch.cat([v, ds[k[:-3] + ".w3"]], dim=1)
        elif k.endswith(".experts.w2"):
            out[k[:-3] + ".down_proj"] = v
        elif k.endswith(".router.gate.weight"):
            out[k[:-len(".router.gate.weight")] + ".gate.weight"] = v
        elif k.endswith(".experts.w3") or k.endswith(".gate.gate.weight"):
            continue
        else:
            out[k] = v
    return out


def same(a, b):
    import torch
    if set(a) != set(b):
        return False
    return all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and
               torch.equal(a[k].contiguous().view(torch.uint8), b[k].contiguous().view(torch.uint8)) for k in a)


def run_case(case, tmp):
    import transformers
    from safetensors.torch import load_file
    ckpt = os.path.join(FIX, case, "ckpt")
    r = zckpt("inspect", ckpt)
    check(r.returncode == 0 and "gate_up_proj" in r.stdout, f"{case}: inspect: {r.stderr.strip()}")
    r = zckpt("verify", ckpt)
    check(r.returncode == 0, f"{case}: verify: {r.stdout.strip()} {r.stderr.strip()}")
    out = os.path.join(tmp, case)
    r = zckpt("consolidate", ckpt, out)
    check(r.returncode == 0, f"{case}: consolidate: {r.stderr.strip()}")
    if r.returncode:
        return
    got = load_file(os.path.join(out, "model.safetensors"))
    want = hf_names(load_file(os.path.join(FIX, case, "expected_fp32.safetensors")))
    check(same(got, want), f"{case}: consolidate != the live engine's fp32 masters")
    shutil.copy(os.path.join(FIX, case, "config.json"), out)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    check(not problems, f"{case}: from_pretrained: {problems}")
    sd = model.state_dict()
    check(all(k in sd and sd[k].equal(v) for k, v in got.items()), f"{case}: from_pretrained weights differ")
    if case.endswith("bf16"):
        out16 = os.path.join(tmp, case + "_bf16")
        r = zckpt("consolidate", ckpt, out16, "--dtype", "bf16")
        check(r.returncode == 0, f"{case}: consolidate --dtype bf16: {r.stderr.strip()}")
        if r.returncode == 0:
            got16 = load_file(os.path.join(out16, "model.safetensors"))
            want16 = hf_names(load_file(os.path.join(FIX, case, "expected_lp.safetensors")))
            check(same(got16, want16), f"{case}: --dtype bf16 != the engine's 16-bit weights")


def main():
    if not os.path.exists(ZCKPT) or not os.path.isdir(FIX):
        print("SKIP: no zckpt binary or no tests/fixtures/autoep")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            run_case(case, tmp)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
