"""interop_python_zero_to_fp32.py LIBZCKPT: the Python package's zero_to_fp32 drop-ins
against DeepSpeed's own functions, run live on every fixture checkpoint.

For each case under tests/fixtures/deepspeed (and exclude_frozen_parameters False/True):
- get_fp32_state_dict_from_zero_checkpoint: same keys in the same order, same dtypes,
  shapes and bits, and the same tensors shared (tied names are one object in both);
- convert_zero_checkpoint_to_fp32_state_dict (safe_serialization True and False): the
  same file names in output_dir, each loading to the same tensors bit for bit;
- load_state_dict_from_zero_checkpoint: a model loaded both ways has equal state.
"""
import os
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ["ZCKPT_LIBRARY"] = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
sys.path.insert(0, here)
import torch  # noqa: E402
from deepspeed.utils import zero_to_fp32 as ds  # noqa: E402
import ds_harness as H  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import zckpt  # noqa: E402

root = os.path.join(H.FIXTURES, "deepspeed")
same_bits = H.bits_equal


def compare(ref, ours, what, failures):
    if list(ref) != list(ours):
        failures.append(f"{what}: keys {list(ours)} != DeepSpeed's {list(ref)}")
        return
    for k in ref:
        if not same_bits(ref[k], ours[k]):
            failures.append(f"{what}: {k}: {ours[k].dtype}{tuple(ours[k].shape)} differs from DeepSpeed's "
                            f"{ref[k].dtype}{tuple(ref[k].shape)}")
    # the same names share one tensor in both
    def groups(sd):
        ids = {}
        for k, t in sd.items():
            ids.setdefault(id(t), []).append(k)
        return sorted(v for v in ids.values() if len(v) > 1)
    if groups(ref) != groups(ours):
        failures.append(f"{what}: shared tensors {groups(ours)} != DeepSpeed's {groups(ref)}")


def load_dir(d):
    out = {}
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if name.endswith(".safetensors"):
            out[name] = load_file(p)
        elif name.endswith(".bin"):
            out[name] = torch.load(p, weights_only=True)
        else:
            out[name] = open(p).read()
    return out


failures, cases = [], 0
with tempfile.TemporaryDirectory() as tmp:
    for case, ckpt in H.fixture_checkpoints():
        cases += 1
        for excl in (False, True):
            what = f"{case} exclude_frozen={excl}"
            try:
                ref = ds.get_fp32_state_dict_from_zero_checkpoint(ckpt, exclude_frozen_parameters=excl)
            except Exception as e:
                ref = e
            try:
                ours = zckpt.get_fp32_state_dict_from_zero_checkpoint(ckpt, exclude_frozen_parameters=excl)
            except zckpt.Error as e:
                ours = e
            if isinstance(ref, Exception) and not isinstance(ours, Exception) and (
                    "is not a zero checkpoint" in str(ref) or "'NoneType' object is not iterable" in str(ref)
                    or (case.endswith("_nvme") and "consumed" in str(ref))):
                # BF16_Optimizer files, ZeRO-0 and NVMe offload (empty partitions in the optim files):
                # DeepSpeed's zero_to_fp32 refuses them, zckpt reads them;
                # its fp32 masters must be the live engine's (expected.json live_fp32_params)
                import hashlib
                import json
                with open(os.path.join(root, case, "expected.json")) as f:
                    live = json.load(f)["live_fp32_params"]
                for n, h in live.items():
                    t = ours.get(n)
                    if t is None or hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest() != h["sha256"]:
                        failures.append(f"{what}: {n}: not the live engine's fp32 master")
                continue
            if isinstance(ref, Exception) or isinstance(ours, Exception):
                if not (isinstance(ref, Exception) and isinstance(ours, Exception)):
                    failures.append(f"{what}: DeepSpeed gives {ref!r:.200}, zckpt {ours!r:.200}")
                continue
            compare(ref, ours, what, failures)
        for safe in (True, False):
            a, b = os.path.join(tmp, case, f"ds{safe}"), os.path.join(tmp, case, f"z{safe}")
            try:
                ds.convert_zero_checkpoint_to_fp32_state_dict(ckpt, a, safe_serialization=safe)
            except Exception as e:
                print(f"{case}: DeepSpeed's convert (safe_serialization={safe}) fails: {type(e).__name__}: {e}"[:300])
                continue
            zckpt.convert_zero_checkpoint_to_fp32_state_dict(ckpt, b, safe_serialization=safe)
            ra, rb = load_dir(a), load_dir(b)
            if sorted(ra) != sorted(rb):
                failures.append(f"{case} convert safe={safe}: files {sorted(rb)} != DeepSpeed's {sorted(ra)}")
                continue
            for f in ra:
                if isinstance(ra[f], str):
                    continue
                ka, kb = ra[f], rb[f]
                if sorted(ka) != sorted(kb):
                    failures.append(f"{case} convert safe={safe}: {f}: keys {sorted(kb)} != {sorted(ka)}")
                    continue
                for k in ka:
                    if not same_bits(ka[k], kb[k]):
                        failures.append(f"{case} convert safe={safe}: {f}: {k} differs")
    # load_state_dict_from_zero_checkpoint on a module with the fixture's names and shapes
    ckpt = os.path.join(root, "s3w2_bf16", "ckpt")
    sd = ds.get_fp32_state_dict_from_zero_checkpoint(ckpt)

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for k, v in sd.items():
                mod = self
                parts = k.split(".")
                for p in parts[:-1]:
                    if not hasattr(mod, p):
                        mod.add_module(p, torch.nn.Module())
                    mod = getattr(mod, p)
                mod.register_parameter(parts[-1], torch.nn.Parameter(torch.zeros_like(v), requires_grad=False))

    m1 = ds.load_state_dict_from_zero_checkpoint(Holder(), ckpt)
    m2 = zckpt.load_state_dict_from_zero_checkpoint(Holder(), ckpt)
    compare(m1.state_dict(), m2.state_dict(), "load_state_dict_from_zero_checkpoint", failures)

for f in failures:
    print("FAIL", f)
print(f"{cases} cases, {len(failures)} failures")
sys.exit(1 if failures or not cases else 0)
