"""interop_dcp_peft.py: the HF Trainer's FSDP checkpoint of a PEFT (LoRA) model, read and moved to DeepSpeed.

The fixture (tests/fixtures/dcp/hf_trainer_lora_w2_fp32, made by tests/fixtures/gen/make_dcp_peft_fixtures.py: the
real HF Trainer, FSDP2, W=2) is an adapter-only save: pytorch_model_fsdp_0/ holds PEFT's get_peft_model_state_dict
(keys without the adapter name: "...lora_A.weight"), optimizer_0/ keys the Adam state and param groups by the
module's names ("...lora_A.default.weight"), and the Trainer's no-decay group is empty. Checked:

  read         `zckpt inspect` and `zckpt verify` accept it; `zckpt consolidate` writes the adapter weights under
               PEFT's keys, every tensor equal to torch's dcp_to_torch_save of the model folder;
  to DeepSpeed `zckpt reshard --to-stage S --to-world-size W` (ZeRO-2 W=1, ZeRO-3 W=2): real DeepSpeed, with the
               same PEFT model and the Trainer's decay group (DeepSpeed drops the empty one, as the converted files
               do), engine.load_checkpoint(OUT, load_module_strict=False) as the Trainer loads a PEFT model: every
               LoRA param's fp32 master, exp_avg and exp_avg_sq equal dcp_to_torch_save's, bit for bit, and the
               loss of a batch right after the load equals the loss torch computes with the checkpoint's adapter
               loaded by PEFT's set_peft_model_state_dict (fp32: exactly; ZeRO-3 W=2: within 1e-6, the ranks
               split the batch).

Prints `N passed, M failed`; exits 0 only if every check passes (77 without a zckpt binary).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(HERE, "..", "fixtures", "gen")
sys.path.insert(0, HERE)
sys.path.insert(0, GEN)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch  # noqa: E402
import ds_harness as H  # noqa: E402

ZCKPT = os.environ.get("ZCK_BIN") or os.path.join(HERE, "..", "..", "build", "bin", "zckpt")
FIX = os.path.join(HERE, "..", "fixtures", "dcp", "hf_trainer_lora_w2_fp32")
CKPT = os.path.join(FIX, "checkpoint-2")
TARGETS = [(2, 1), (3, 2)]


def zckpt(*args):
    err = H.zckpt(*args)
    return err and f"zckpt {args[0]} failed: {err}"


def torch_state(tmp):
    """What torch's dcp_to_torch_save reads from the model and optimizer folders."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = {}
    for sub in ("pytorch_model_fsdp_0", "optimizer_0"):
        pt = os.path.join(tmp, sub + ".pt")
        dcp_to_torch_save(os.path.join(CKPT, sub), pt)
        out.update(torch.load(pt, weights_only=False))
    return out["model"], out["optimizer"]


def batch():
    from make_hf_peft_fixtures import VOCAB, SEQ
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(7))
    return ids


def torch_loss(adapter):
    """The loss of batch() with the checkpoint's adapter loaded into the same PEFT model by PEFT itself."""
    from make_hf_peft_fixtures import build_peft_model
    from peft import set_peft_model_state_dict
    model = build_peft_model(False)
    res = set_peft_model_state_dict(model, adapter)
    assert not res.unexpected_keys, res.unexpected_keys
    ids = batch()
    with torch.no_grad():
        return model(input_ids=ids, labels=ids).loss.item()


def read_checks(tmp, model):
    probs = []
    for job in ("inspect", "verify"):
        err = zckpt(job, FIX)
        if err:
            probs.append(err)
    out = os.path.join(tmp, "consolidated")
    err = zckpt("consolidate", "-q", FIX, out)
    if err:
        return probs + [err]
    from safetensors.torch import load_file
    got = load_file(os.path.join(out, "model.safetensors"))
    if sorted(got) != sorted(model):
        probs.append(f"consolidated keys {sorted(got)[:3]}... != dcp_to_torch_save's {sorted(model)[:3]}...")
    for k, v in model.items():
        if k in got and not (got[k].dtype == v.dtype and torch.equal(got[k], v)):
            probs.append(f"{k}: consolidated tensor differs from dcp_to_torch_save's")
    return probs


def ds_worker(spec_path):
    """DeepSpeed on the PEFT model at ZeRO-S, W ranks: load_checkpoint as the Trainer does, then the state and the
    loss of batch()."""
    import deepspeed
    import torch.distributed as dist
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    from make_hf_peft_fixtures import build_peft_model
    with open(spec_path) as f:
        spec = json.load(f)
    deepspeed.init_distributed(dist_backend="gloo")
    model = build_peft_model(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    # the Trainer's groups: decay (every LoRA weight) and an empty no-decay group
    groups = [{"params": trainable, "weight_decay": 0.1}, {"params": [], "weight_decay": 0.0}]
    cfg = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**6,
           "zero_optimization": {"stage": spec["stage"]},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    path, _ = engine.load_checkpoint(spec["load"], load_module_strict=False)
    if path is None:
        raise RuntimeError(f"load_checkpoint({spec['load']}) returned None")
    opt = engine.optimizer
    if spec["stage"] < 3:
        opt._hp_optimizer_states_linked = False   # link the state fragments now (ds_harness.snapshot says why)
        opt._lazy_init_hp_params_optimizer_state()
    res = {"gathered": {}}
    for n, p in engine.module.named_parameters():
        if p.requires_grad:
            res["gathered"][n] = {"fp32": safe_get_full_fp32_param(p).detach().clone()}
            for k in ("exp_avg", "exp_avg_sq"):
                res["gathered"][n][k] = safe_get_full_optimizer_state(p, k).detach().clone()
    ids = batch()
    rank, world = dist.get_rank(), dist.get_world_size()
    per = ids.shape[0] // world
    mine = ids[rank * per:(rank + 1) * per]
    with torch.no_grad():
        loss = engine(input_ids=mine, labels=mine).loss.detach().clone()
    dist.all_reduce(loss)
    res["loss"] = loss.item() / world
    if rank == 0:
        torch.save(res, spec["out"])


def to_deepspeed(tmp, stage, world, model, optim, want_loss):
    out = os.path.join(tmp, f"s{stage}w{world}")
    err = zckpt("reshard", "-q", FIX, out, "--to-stage", str(stage), "--to-world-size", str(world))
    if err:
        return [err]
    spec = {"load": out, "stage": stage, "out": out + ".res.pt"}
    err = H.launch_spec(__file__, "--ds", out + ".json", spec, world, out + ".log", 300)
    if err:
        return [f"DeepSpeed failed: {err}"]
    got = torch.load(spec["out"], weights_only=False)
    probs = []
    if sorted(got["gathered"]) != sorted(optim["state"]):
        probs.append(f"trainable params {sorted(got['gathered'])[:2]}... != the optimizer's {sorted(optim['state'])[:2]}...")
    for n, g in got["gathered"].items():
        key = n.replace(".default.", ".")   # PEFT's checkpoint key of module param n (adapter "default")
        if key not in model or not torch.equal(g["fp32"], model[key]):
            probs.append(f"{n}: fp32 master differs from the checkpoint's {key}")
        for k in ("exp_avg", "exp_avg_sq"):
            if n not in optim["state"] or not torch.equal(g[k], optim["state"][n][k]):
                probs.append(f"{n}: {k} differs from the checkpoint's")
    tol = 0.0 if world == 1 else 1e-6 * abs(want_loss)
    if abs(got["loss"] - want_loss) > tol:
        probs.append(f"loss after the load {got['loss']!r} != torch + PEFT's {want_loss!r}")
    return probs


def scenario(tmp):
    model, optim = torch_state(tmp)
    results = [("HF Trainer FSDP + LoRA: inspect, verify, consolidate = dcp_to_torch_save", read_checks(tmp, model))]
    want = torch_loss(model)
    for stage, world in TARGETS:
        results.append((f"HF Trainer FSDP + LoRA -> DeepSpeed ZeRO-{stage} W={world}: loaded, state and loss",
                        to_deepspeed(tmp, stage, world, model, optim, want)))
    return results


def main():
    if not os.path.exists(ZCKPT):
        print(f"skip: no zckpt binary at {ZCKPT}")
        return 77
    return H.run_scenarios([("peft", scenario)], "zck-dcp-peft-")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--ds":
        ds_worker(sys.argv[2])
        H.end_worker()
    sys.exit(main())
