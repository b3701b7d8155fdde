"""interop_consolidate.py: `zckpt consolidate` against DeepSpeed's zero_to_fp32, run live.

For every real DeepSpeed checkpoint under tests/fixtures/deepspeed/<case>/ckpt, run
deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint now (not the
committed result), consolidate with zckpt, and require every tensor to be equal bit for
bit (names, dtypes, shapes, bytes); tied aliases must be recorded in the metadata. Also
checks pytorch_model.bin loads with torch.load(weights_only=True) and keeps the tie.
"""
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import ds_harness as H  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # noqa: E402

zckpt = os.environ["ZCK_BIN"]
same_bits = H.bits_equal

failures, cases = [], 0
with tempfile.TemporaryDirectory() as tmp:
    for case, ckpt in H.fixture_checkpoints():
        try:
            ref = get_fp32_state_dict_from_zero_checkpoint(ckpt)
        except Exception as e:  # zero_to_fp32 itself cannot convert this one
            print(f"{case}: zero_to_fp32 fails ({type(e).__name__}); skipped")
            continue
        out = os.path.join(tmp, case)
        r = subprocess.run([zckpt, "consolidate", "-q", "--format", "both", ckpt, out], capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"{case}: zckpt failed: {r.stderr.strip()}")
            continue
        ours = load_file(os.path.join(out, "model.safetensors"))
        with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
            tied = json.loads((f.metadata() or {}).get("tied_parameters", "{}"))
        ptrs = {}
        for name, t in ref.items():
            ptrs.setdefault(t.data_ptr(), name)
        for name, t in ref.items():
            first = ptrs[t.data_ptr()]
            if first != name:  # an alias sharing memory with `first`
                if name in ours or tied.get(name) != first:
                    failures.append(f"{case}: alias {name} -> {first} not recorded as tied")
                continue
            if name not in ours:
                failures.append(f"{case}: {name} missing")
            elif not same_bits(ours[name], t):
                failures.append(f"{case}: {name} differs ({ours[name].dtype} {tuple(ours[name].shape)} vs {t.dtype} {tuple(t.shape)})")
        extra = set(ours) - set(ref)
        if extra:
            failures.append(f"{case}: extra tensors {sorted(extra)}")
        sd = torch.load(os.path.join(out, "pytorch_model.bin"), weights_only=True)
        for name, t in ref.items():
            if name not in sd or not same_bits(sd[name], t):
                failures.append(f"{case}: pytorch_model.bin {name} differs")
        for alias, src in tied.items():
            if sd[alias].data_ptr() != sd[src].data_ptr():
                failures.append(f"{case}: pytorch_model.bin does not keep {alias} tied to {src}")
        cases += 1

for f in failures:
    print("FAIL", f)
print(f"{cases - len({f.split(':')[0] for f in failures})} passed, {len({f.split(':')[0] for f in failures})} failed")
sys.exit(1 if failures or cases == 0 else 0)
