"""interop_ds_resume.py ZCKPT_TRAIN: DeepSpeed itself resumes from zckpt-train checkpoints.

zckpt-train trains 6 steps on 2 ranks with ZeRO 1, 2 and 3 (bf16, HF optimizer: two param
groups) and saves checkpoint-6/ (ZeRO 2 and 3 with --async-save: written by the background
writer from the host snapshot). Then two real DeepSpeed 0.19 ranks on the CPU (gloo), one
process each, build transformers' GPT2LMHeadModel with the same param groups and the
checkpoint's ds_config, call engine.load_checkpoint(load_optimizer_states=True) and check:
global_steps, every 16-bit weight equal to the engine's final weights (--dump-dir), the
probe loss close to the engine's (DeepSpeed computes in bf16), and that a further training
step runs on the loaded optimizer state. Exit 77 without torch/transformers/deepspeed.
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import deepspeed  # noqa: F401
    from safetensors.torch import load_file  # noqa: F401
except Exception as e:  # noqa: BLE001
    print(f"SKIP: needs torch, transformers, deepspeed and safetensors ({e})", file=sys.stderr)
    sys.exit(77)

RANK_SCRIPT = r'''
import os, sys
import torch, deepspeed, transformers
from safetensors import safe_open
from safetensors.torch import load_file
deepspeed.init_distributed(dist_backend="gloo")
for ck, dump in zip(sys.argv[1::2], sys.argv[2::2]):
    tag = open(os.path.join(ck, "latest")).read().strip()
    mfile = sorted(f for f in os.listdir(os.path.join(ck, tag)) if f.endswith("model_states.pt"))[0]
    ms = torch.load(os.path.join(ck, tag, mfile), weights_only=False)
    ds_config = dict(ms["ds_config"])
    ds_config["zero_allow_untested_optimizer"] = True
    stage = ds_config["zero_optimization"]["stage"]
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config.from_pretrained(ck))
    named = list(model.named_parameters())
    nodecay = lambda n: n.endswith(".bias") or ".ln_" in n
    groups = [{"params": [p for n, p in named if not nodecay(n)], "weight_decay": 0.1},
              {"params": [p for n, p in named if nodecay(n)], "weight_decay": 0.0}]
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(groups, lr=1e-3),
                                             config=ds_config)
    path, _ = engine.load_checkpoint(ck, load_optimizer_states=True, load_lr_scheduler_states=False)
    assert path is not None, f"{ck}: load_checkpoint returned None"
    assert engine.global_steps == ms["global_steps"] == 6, (engine.global_steps, ms["global_steps"])
    ref = load_file(os.path.join(dump, "model.safetensors"))
    probe = load_file(os.path.join(dump, "probe.safetensors"))
    with safe_open(os.path.join(dump, "probe.safetensors"), "pt") as f:
        engine_loss = float(f.metadata()["loss"])
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=(stage == 3)):
        bad = [n for n, p in engine.module.named_parameters() if not torch.equal(p.detach().float(), ref[n])]
        with torch.no_grad():
            logits = engine.module(probe["input_ids"]).logits.float()
    assert not bad, f"{ck}: weights differ after load_checkpoint: {bad[:4]}"
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), probe["labels"].view(-1)).item()
    assert abs(loss - engine_loss) < 0.02 * engine_loss, (loss, engine_loss)
    out = engine(probe["input_ids"], labels=probe["input_ids"]).loss
    engine.backward(out)
    engine.step()
    assert engine.global_steps == 7
    if torch.distributed.get_rank() == 0:
        print(f"ZeRO-{stage}: DeepSpeed loaded {ck} (step 6), weights equal, probe loss {loss:.5f} "
              f"vs engine {engine_loss:.5f}, step 7 ran", flush=True)
# Every check passed: leave without the interpreter's teardown, where gloo/DeepSpeed threads
# sometimes abort ("terminate called without an active exception") after the work is done.
torch.distributed.barrier()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


def main():
    binary = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    launcher = os.path.join(here, "..", "fixtures", "gen", "ds_launch.py")
    with tempfile.TemporaryDirectory() as tmp:
        args = []
        for z in (1, 2, 3):
            out = os.path.join(tmp, f"z{z}")
            subprocess.run([binary, "--ranks", "2", "--zero-stage", str(z), "--bf16", "--max-steps", "6",
                            "--save-steps", "6", "--output-dir", out, "--dump-dir", os.path.join(out, "dump"),
                            "--per-device-train-batch-size", "2", "--weight-decay", "0.1", "--n-positions", "32",
                            "--n-embd", "32", "--n-head", "4", "--eval-samples", "2", "--quiet"]
                           + (["--async-save"] if z > 1 else []), check=True)
            args += [os.path.join(out, "checkpoint-6"), os.path.join(out, "dump")]
        script = os.path.join(tmp, "rank.py")
        with open(script, "w") as f:
            f.write(RANK_SCRIPT)
        log = os.path.join(tmp, "ds")
        sys.path.insert(0, os.path.dirname(launcher))
        from ds_launch import launch
        rc = launch(2, [script] + args, log_prefix=log)
        text = open(log + ".rank0.log").read()
        for line in text.splitlines():
            if line.startswith("ZeRO-") or "Error" in line or "assert" in line:
                print(line)
        if rc != 0:
            print(text[-4000:], file=sys.stderr)
            print(open(log + ".rank1.log").read()[-2000:], file=sys.stderr)
            sys.exit(1)
        assert text.count("DeepSpeed loaded") == 3, text[-2000:]
    print("ok")


if __name__ == "__main__":
    main()
