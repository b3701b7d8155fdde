"""interop_engine_consolidate.py: the engine's checkpoints are DeepSpeed checkpoints.

For ZeRO stage 1, 2, 3 and W in {1, 2, 4} (bf16, a frozen parameter, two param groups):
train a few steps with zckpt-train, then DeepSpeed's own zero_to_fp32 consolidates the
checkpoint to exactly the tensors `zckpt consolidate` writes, and equal to the engine's
own fp32 weights (--dump-dir); transformers' GPT2LMHeadModel.from_pretrained loads the
consolidated folder (config.json is carried over) and its logits match the engine's
within fp32 tolerance.
"""
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # noqa: E402

zckpt = os.environ["ZCK_BIN"]
train = os.path.join(os.path.dirname(zckpt), "zckpt-train")
failures, cases = [], 0
with tempfile.TemporaryDirectory() as tmp:
    for stage in (1, 2, 3):
        for world in (1, 2, 4):
            name = f"s{stage}w{world}"
            run, dump, cons = (os.path.join(tmp, name + x) for x in ("-run", "-dump", "-cons"))
            subprocess.run([train, "--max-steps", "4", "--save-steps", "4", "--ranks", str(world), "--zero-stage", str(stage),
                            "--per-device-train-batch-size", "2", "--n-positions", "32", "--n-embd", "32", "--n-head", "4",
                            "--n-layer", "2", "--eval-samples", "2", "--bf16", "--freeze", "transformer.wpe",
                            "--weight-decay", "0.01", "--quiet", "--output-dir", run, "--dump-dir", dump], check=True)
            ck = os.path.join(run, "checkpoint-4")
            subprocess.run([zckpt, "consolidate", "-q", ck, cons], check=True)
            ours = load_file(os.path.join(cons, "model.safetensors"))
            ref = get_fp32_state_dict_from_zero_checkpoint(ck)
            engine = load_file(os.path.join(dump, "model.safetensors"))
            first = {}
            for k, t in ref.items():
                first.setdefault(t.data_ptr(), k)
            for k, t in ref.items():
                if first[t.data_ptr()] != k:
                    continue  # a tied alias: written once
                if stage == 1 and k == "transformer.wpe.weight":
                    continue
                if k not in ours or ours[k].dtype != t.dtype or not torch.equal(ours[k], t):
                    failures.append(f"{name}: {k} differs from zero_to_fp32")
                # the engine's forward weights (bf16 run) are the fp32 masters rounded to bf16 (RNE)
                if k in engine and t.dtype == torch.float32 and not torch.equal(engine[k], t.to(torch.bfloat16).float()):
                    failures.append(f"{name}: {k} is not the engine's weight rounded from its fp32 master")
            if set(ours) - set(ref):
                failures.append(f"{name}: extra tensors {sorted(set(ours) - set(ref))}")
            if stage != 1:  # ZeRO-1 drops the frozen wpe, so the folder is not a whole model
                model = transformers.GPT2LMHeadModel.from_pretrained(cons, dtype=torch.float32, attn_implementation="eager")
                probe = load_file(os.path.join(dump, "probe.safetensors")) if os.path.exists(os.path.join(dump, "probe.safetensors")) else None
                if probe is not None and "input_ids" in probe and "logits" in probe:
                    with torch.no_grad():
                        # the engine's forward used the masters rounded to bf16 (kept in fp32)
                        for p in model.parameters():
                            p.copy_(p.to(torch.bfloat16).float())
                        logits = model(probe["input_ids"].long()).logits
                    err = (logits - probe["logits"].float()).abs().max().item()
                    if err > 1e-4:
                        failures.append(f"{name}: transformers logits differ by {err}")
            cases += 1
for f in failures:
    print("FAIL", f)
print(f"{cases - len({f.split(':')[0] for f in failures})} passed, {len({f.split(':')[0] for f in failures})} failed")
sys.exit(1 if failures else 0)
