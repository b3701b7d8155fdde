"""interop_hf_shards.py: zckpt's sharded safetensors output puts every tensor in the file
huggingface_hub's split_torch_state_dict_into_shards names for it (the function
transformers' save_pretrained and DeepSpeed's zero_to_fp32 shard with), for several
models, dtypes and max_shard_size values (numbers and HF size strings, at and around the
tensors' own sizes): the index's weight_map, each shard's tensors and the single-file case.

consolidate: the state dict is DeepSpeed's get_fp32_state_dict_from_zero_checkpoint, in its
order, less the tied aliases zckpt records in the metadata instead of storing (the hub
function puts an alias with the tensor it shares storage with, adding no size); each
tensor is sized as stored (zero_to_fp32 sizes empty tensors of their dtype, as here).
convert: a torch.save'd state dict of GPT-2-like tensors, in its order."""
import json
import os
import subprocess
import sys
import tempfile
import warnings

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors import safe_open

warnings.filterwarnings("ignore")
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # noqa: E402

zckpt = os.environ["ZCK_BIN"]
fixtures = os.environ.get("ZCK_FIXTURES", os.path.join(os.path.dirname(__file__), "..", "fixtures"))
PATTERN = "model{suffix}.safetensors"
failures = []
checked = 0


def run(*args):
    r = subprocess.run([zckpt, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL zckpt {' '.join(args)}: {r.stderr.strip()}")


def zckpt_layout(out):
    """{tensor: file} of zckpt's output folder, checked against each shard's own header."""
    index = os.path.join(out, "model.safetensors.index.json")
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
    else:
        weight_map = None
    held = {}
    for name in files:
        with safe_open(os.path.join(out, name), "pt") as f:
            for k in f.keys():
                held[k] = name
    if weight_map is not None and weight_map != held:
        failures.append(f"{out}: the index's weight_map disagrees with the shards' headers")
    return held


def sizes_of(state_dict):
    return {k: v.numel() * v.element_size() for k, v in state_dict.items()}


def candidates(sizes):
    """max_shard_size values around the tensors' own sizes, and HF size strings."""
    s = sorted(set(sizes.values()))
    total = sum(sizes.values())
    nums = {1, s[0], s[-1], s[-1] - 1, s[-1] + 1, max(1, total // 7), total // 3, total // 2, total, total + 1}
    if len(s) > 2:
        nums |= {s[len(s) // 2], s[len(s) // 2] + s[0], s[-1] + s[-2], s[-1] + s[-2] - 1}
    strings = ["1KB", "2KB", "2.5KB", "0.3KB", "4kb", "1e3KB", " 3KB "]
    return [n for n in sorted(nums) if n > 0] + strings


def compare(label, state_dict, out, max_shard_size):
    global checked
    want = split_torch_state_dict_into_shards(state_dict, filename_pattern=PATTERN,
                                              max_shard_size=max_shard_size).tensor_to_filename
    got = zckpt_layout(out)
    checked += 1
    if got != want:
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        failures.append(f"{label} max_shard_size={max_shard_size!r}: {len(diff)} tensors differ, e.g. "
                        f"{diff[0]}: zckpt {got.get(diff[0])}, huggingface_hub {want.get(diff[0])}")


def tied_aliases(out):
    """The aliases zckpt recorded in the metadata instead of storing."""
    files = [f for f in os.listdir(out) if f.endswith(".safetensors")]
    with safe_open(os.path.join(out, sorted(files)[0]), "pt") as f:
        meta = f.metadata() or {}
    return set(json.loads(meta.get("tied_parameters", "{}")))


CASES = ["s1w2_bf16", "s1w3_bf16_3groups", "s2w3_bf16", "s2w4_fp32_3groups", "s2w2_fp32_zeronumel", "s3w2_bf16",
         "s3w3_bf16_subgroup100", "s3w4_fp32_3groups"]
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

with tempfile.TemporaryDirectory() as tmp:
    n = 0
    for case in CASES:
        ckpt = os.path.join(fixtures, "deepspeed", case, "ckpt")
        if not os.path.isdir(ckpt):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = get_fp32_state_dict_from_zero_checkpoint(ckpt)
        for dtype in (None, "bf16"):
            probe = os.path.join(tmp, f"probe{n}")
            n += 1
            run("consolidate", "-q", *(["--dtype", dtype] if dtype else []), ckpt, probe)
            tied = tied_aliases(probe)
            sd = {}
            for k, v in ds.items():   # as stored: zero_to_fp32's dtypes, or every float cast
                if k in tied:
                    continue
                t = v.to(torch.bfloat16) if dtype and v.dtype in FLOATS else v
                sd[k] = torch.empty(t.shape, dtype=t.dtype)
            if set(sd) != set(zckpt_layout(probe)):
                failures.append(f"{case} dtype={dtype}: zckpt's tensors are not DeepSpeed's less the tied aliases")
                continue
            for size in candidates(sizes_of(sd)):
                out = os.path.join(tmp, f"c{n}")
                n += 1
                run("consolidate", "-q", *(["--dtype", dtype] if dtype else []), "--max-shard-size", str(size), ckpt, out)
                compare(f"consolidate {case} dtype={dtype}", sd, out, size)

    # convert: a larger model's state dict (GPT-2-like names and shapes, mixed dtypes), in
    # the order torch.save keeps
    g = torch.Generator().manual_seed(7)
    sd = {"wte.weight": torch.randn(301, 64, generator=g), "wpe.weight": torch.randn(128, 64, generator=g)}
    for layer in range(6):
        p = f"h.{layer}."
        sd[p + "ln_1.weight"] = torch.randn(64, generator=g)
        sd[p + "ln_1.bias"] = torch.randn(64, generator=g)
        sd[p + "attn.c_attn.weight"] = torch.randn(64, 192, generator=g).to(torch.bfloat16 if layer % 2 else torch.float32)
        sd[p + "attn.c_attn.bias"] = torch.randn(192, generator=g)
        sd[p + "attn.c_proj.weight"] = torch.randn(64, 64, generator=g).half()
        sd[p + "mlp.c_fc.weight"] = torch.randn(64, 256, generator=g)
        sd[p + "mlp.c_proj.weight"] = torch.randn(256, 64, generator=g)
        sd[p + "attn.bias"] = torch.ones(1, 1, 32, 32, dtype=torch.bool)
    sd["ln_f.weight"] = torch.randn(64, generator=g)
    sd["empty"] = torch.zeros(0, 3)
    sd["step"] = torch.tensor(12, dtype=torch.int64)
    src = os.path.join(tmp, "gpt2.pt")
    torch.save(sd, src)
    ref = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in sd.items()}
    sizes = sizes_of(ref)
    for size in candidates(sizes) + ["20KB", "100KB", "0.1MB", "77777"]:
        out = os.path.join(tmp, f"v{n}")
        n += 1
        run("convert", "-q", "--max-shard-size", str(size), src, out)
        compare("convert gpt2-like", ref, out, int(size) if isinstance(size, str) and size.isdigit() else size)

for f in failures:
    print("FAIL", f)
print(f"{checked} layouts compared with huggingface_hub's split_torch_state_dict_into_shards, {len(failures)} failures")
sys.exit(1 if failures or not checked else 0)
