"""interop_gpt2.py ZCKPT_TRAIN: the engine's model is transformers' GPT2LMHeadModel.

Trains a few steps with zckpt-train (ZeRO-3 over 2 ranks, fp32 and bf16), dumps the final
weights as model.safetensors + config.json and a probe (inputs, the engine's logits and
loss), loads them with GPT2LMHeadModel.from_pretrained and checks that every parameter name
and shape matches (lm_head tied to wte) and that logits and loss agree within fp32
tolerance: this proves the HF names, the Conv1D [in, out] layouts and gelu_new.
Exit 77 when torch, transformers or safetensors is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from safetensors.torch import load_file
except Exception as e:  # noqa: BLE001
    print(f"SKIP: needs torch, transformers and safetensors ({e})", file=sys.stderr)
    sys.exit(77)


def check(binary, tmp, extra):
    out = os.path.join(tmp, "dump" + "_".join(extra).replace("-", ""))
    cmd = [binary, "--max-steps", "8", "--ranks", "2", "--zero-stage", "3", "--per-device-train-batch-size", "2",
           "--n-positions", "32", "--n-embd", "32", "--n-head", "4", "--n-layer", "2", "--eval-samples", "2",
           "--quiet", "--dump-dir", out] + extra
    subprocess.run(cmd, check=True)
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["model_type"] == "gpt2" and cfg["activation_function"] == "gelu_new", cfg
    model = transformers.GPT2LMHeadModel.from_pretrained(out, attn_implementation="eager",
                                                         dtype=torch.float32)
    model.eval()
    sd = load_file(os.path.join(out, "model.safetensors"))
    names = [n for n, _ in model.named_parameters()]
    assert names == list(sd.keys()) or sorted(names) == sorted(sd.keys()), (names, list(sd.keys()))
    for n, p in model.named_parameters():
        assert tuple(p.shape) == tuple(sd[n].shape), (n, p.shape, sd[n].shape)
        assert torch.equal(p.detach(), sd[n]), n
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "lm_head not tied"
    assert "lm_head.weight" in model.state_dict()

    probe_path = os.path.join(out, "probe.safetensors")
    probe = load_file(probe_path)
    from safetensors import safe_open
    with safe_open(probe_path, "pt") as f:
        engine_loss = float(f.metadata()["loss"])
    with torch.no_grad():
        logits = model(probe["input_ids"]).logits
    diff = (logits - probe["logits"]).abs().max().item()
    scale = probe["logits"].abs().max().item()
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), probe["labels"].view(-1)).item()
    print(f"{' '.join(extra) or 'fp32'}: max |logits diff| {diff:.3g} (max |logit| {scale:.3g}), "
          f"loss {loss:.7f} vs engine {engine_loss:.7f}")
    assert diff < 1e-4 * max(1.0, scale), diff
    assert abs(loss - engine_loss) < 1e-5 * max(1.0, engine_loss), (loss, engine_loss)


def main():
    binary = sys.argv[1]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        check(binary, tmp, [])
        check(binary, tmp, ["--bf16"])
    print("ok")


if __name__ == "__main__":
    main()
