"""interop_dcp_to_dcp.py: `zckpt reshard DCP OUT --to-format dcp|dcp-accelerate`, loaded by torch FSDP2.

A DCP moved to another folder shape, world size or storage: torchtitan's step-N (flat keys, flattened optimizer)
as Accelerate's / the HF Trainer's pytorch_model_fsdp_0/ + optimizer_0/, an HF Trainer checkpoint-N as a plain
get_state_dict folder, a W=2 save for W=3, a safetensors-storage save (model only) as torch_save storage, a bf16
model's save. For each (real fixtures of tests/fixtures/dcp, made by torch, Accelerate and the Trainer):

  same state   torch's dcp_to_torch_save of the output holds every weight and Adam state of the source's own,
               keyed the same, equal bit for bit (float32: a bf16 source's values widened exactly, as FSDP2
               keeps params), one Adam step, and param groups with the source's settings and members;
  FSDP2 loads  W processes build the fixture's Llama under FSDP2 (fully_shard on a CPU mesh, AdamW over the
               output's groups), dcp.load the output into get_state_dict's dicts (Accelerate's shape: each
               folder under its own root key, as load_fsdp_model / load_fsdp_optimizer do) and set_state_dict:
               every full weight and Adam moment torch.equal the source's.

Refused in one line naming the folder, nothing at OUT: an adapter-only PEFT save (its optimizer names its params
otherwise than its model folder).

Prints `N passed, M failed`; exits 0 only if every case passes (77 without a zckpt binary).
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(HERE, "..", "fixtures", "gen")
FIX = os.path.join(HERE, "..", "fixtures", "dcp")
sys.path.insert(0, HERE)
sys.path.insert(0, GEN)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch  # noqa: E402
import ds_harness as H  # noqa: E402
import fsdp2_harness as F  # noqa: E402

ZCKPT = os.environ.get("ZCK_BIN") or os.path.join(HERE, "..", "..", "build", "bin", "zckpt")
# (source under tests/fixtures/dcp, its model for make_dcp_fixtures.build_model, target format, target W)
CASES = [
    ("titan_untied_w2_fp32/step-3", (False, "fp32"), "dcp-accelerate", 2),
    ("hf_trainer_tied_w2_fp32/checkpoint-2", (True, "fp32"), "dcp", 1),
    ("llama_tied_w2_fp32", (True, "fp32"), "dcp", 3),
    ("llama_untied_w2_bf16", (False, "bf16"), "dcp", 2),
    ("st_tp2_dp2_fp32/sharded", (False, "tp"), "dcp", 2),
]


def zckpt(*args):
    r = subprocess.run([ZCKPT, *args], capture_output=True, text=True)
    return r


def torch_full(path):
    """dcp_to_torch_save of a DCP folder, or of Accelerate's two folders merged; as get_state_dict's nesting
    {"model": {fqn: t}, "optim": {"state": {fqn: {k: t}}, "param_groups": [...]}}. torchtitan's flat keys and
    flattened optimizer, and a model-only save, are brought to it."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from interop_dcp_to_ds import titan_unflattened
    parts = [os.path.join(path, d) for d in ("pytorch_model_fsdp_0", "optimizer_0") if os.path.isdir(os.path.join(path, d))]
    sd = {}
    with tempfile.TemporaryDirectory() as td:
        for i, d in enumerate(parts or [path]):
            pt = os.path.join(td, f"{i}.pt")
            dcp_to_torch_save(d, pt)
            sd.update(torch.load(pt, weights_only=False))
    if "optimizer" in sd and "model" not in sd:
        sd = titan_unflattened(sd)
    if "optimizer" in sd:
        sd["optim"] = sd.pop("optimizer")
    if "model" not in sd:   # a model-only save of get_model_state_dict: the keys at the top
        sd = {"model": sd}
    sd.setdefault("optim", {"state": {}, "param_groups": []})
    return sd


def safetensors_full(path):
    """A safetensors-storage save holds the model alone: torch's own consolidation of it beside (expected.json)."""
    from safetensors.torch import load_file
    return {"model": load_file(os.path.join(os.path.dirname(path), "model-00001-of-00001.safetensors")),
            "optim": {"state": {}, "param_groups": []}}


def same_state(src, out):
    probs = []
    if sorted(src["model"]) != sorted(out["model"]):
        return [f"model keys differ: only source {sorted(set(src['model']) - set(out['model']))[:3]}, "
                f"only output {sorted(set(out['model']) - set(src['model']))[:3]}"]
    for k, t in src["model"].items():
        got = out["model"][k]
        if got.dtype != torch.float32 or not torch.equal(got, t.float()):
            probs.append(f"model {k}: {got.dtype} differs from the source's {t.dtype}")
    if sorted(src["optim"]["state"]) != sorted(out["optim"]["state"]):
        return probs + ["optimizer state keys differ"]
    for fqn, st in src["optim"]["state"].items():
        for k, t in st.items():
            got = out["optim"]["state"][fqn].get(k)
            if got is None or not torch.equal(got.float(), t.float()):
                probs.append(f"optim {fqn}.{k} differs from the source's")
    sg, og = src["optim"]["param_groups"], out["optim"]["param_groups"]
    if len(sg) != len(og):
        probs.append(f"{len(og)} param groups, the source has {len(sg)}")
    for i, (a, b) in enumerate(zip(sg, og)):
        for k, v in a.items():
            seq = lambda x: list(x) if isinstance(x, (list, tuple)) else x  # noqa: E731
            if k in ("params", "settings"):
                continue
            if seq(b.get(k)) != seq(v):
                probs.append(f"param group {i}: {k} = {b.get(k)!r}, the source's {v!r}")
        if "params" in a and list(a["params"]) != list(b["params"]):
            probs.append(f"param group {i}: params differ")
    return probs


def fsdp2_worker(spec_path):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import make_dcp_fixtures as M
    with open(spec_path) as f:
        spec = json.load(f)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ref = torch.load(spec["ref"], weights_only=False)
    tied, precision = spec["model"]
    model = M.build_model(tied, "bf16" if precision == "bf16" else "fp32")
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    named = dict(model.named_parameters())
    groups = [{"params": [named[n] for n in g["params"]]} for g in ref["groups"]]
    opt = torch.optim.AdamW(groups or [p for p in model.parameters()], lr=0.01)
    if ref["has_optim"]:   # Adam's state exists once a step has run: one on zero grads, then overwritten
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
    msd, osd = get_state_dict(model, opt)
    if spec["accelerate"]:
        m = {"model": msd}
        dcp.load(m, checkpoint_id=os.path.join(spec["dcp"], "pytorch_model_fsdp_0"))
        o = {"optimizer": osd}
        dcp.load(o, checkpoint_id=os.path.join(spec["dcp"], "optimizer_0"))
        msd, osd = m["model"], o["optimizer"]
    else:
        sd = {"model": msd, "optim": osd} if ref["has_optim"] else {"model": msd}
        dcp.load(sd, checkpoint_id=spec["dcp"])
        msd, osd = sd["model"], sd.get("optim", osd)
    if ref["has_optim"]:
        set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    else:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict
        set_model_state_dict(model, msd)
    probs = []
    for n, p in model.named_parameters():
        key = n
        if key not in ref["model"]:
            probs.append(f"{n}: not in the source")
            continue
        if not torch.equal(F.full(p).float(), ref["model"][key].float()):
            probs.append(f"{n}: weight differs from the source's")
        if ref["has_optim"]:
            st = opt.state.get(p, {})
            for k in ("exp_avg", "exp_avg_sq"):
                want = ref["state"].get(n, {}).get(k)
                if want is None or k not in st or not torch.equal(F.full(st[k]).float(), want.float()):
                    probs.append(f"{n}: {k} differs from the source's")
    with open(f"{spec['out']}.rank{rank}.json", "w") as f:
        json.dump({"problems": probs}, f)
    dist.barrier()
    dist.destroy_process_group()


def case(tmp, name, model, fmt, world):
    src = os.path.join(FIX, name)
    tag = name.replace("/", "_")
    out = os.path.join(tmp, tag)
    r = zckpt("reshard", "-q", src, out, "--to-format", fmt, "--to-world-size", str(world))
    label = f"{name} -> {fmt} W={world}"
    if r.returncode != 0:
        return [(label, [f"zckpt reshard failed (exit {r.returncode}): {r.stderr.strip()}"])]
    want = safetensors_full(src) if name.startswith("st_") else torch_full(src)
    got = torch_full(out)
    results = [(label + ": same state as the source (dcp_to_torch_save)", same_state(want, got))]
    if model[1] == "tp":   # a tensor-parallel run's model cannot be rebuilt without its mesh: state only
        return results
    ref = {"model": want["model"], "state": got["optim"]["state"], "groups": got["optim"]["param_groups"],
           "has_optim": bool(got["optim"]["state"])}
    # torchtitan's flat keys are the module's own names; get_state_dict's are too
    ref_path = os.path.join(tmp, tag + ".ref.pt")
    torch.save(ref, ref_path)
    probs, _ = F.launch(tmp, tag + ".fsdp2", world, __file__,
                        {"dcp": out, "ref": ref_path, "model": list(model), "accelerate": fmt == "dcp-accelerate"})
    results.append((label + f": FSDP2 at W={world} loads it, every weight and moment the source's", probs))
    return results


def refused(tmp):
    src = os.path.join(FIX, "hf_trainer_lora_w2_fp32")
    out = os.path.join(tmp, "peft.dcp")
    r = zckpt("reshard", "-q", src, out, "--to-format", "dcp")
    lines = r.stderr.strip().splitlines()
    probs = []
    if r.returncode != 1 or len(lines) != 1 or "adapter-only PEFT" not in lines[0] or src not in lines[0]:
        probs.append(f"exit {r.returncode}, wanted 1 and one line naming the folder: {r.stderr.strip()!r}")
    if os.path.exists(out):
        probs.append("something was left at OUT")
    return [("adapter-only PEFT save -> dcp: refused in one line", probs)]


def main():
    if not os.path.exists(ZCKPT):
        print(f"skip: no zckpt binary at {ZCKPT}")
        return 77
    scenarios = [(c[0], lambda tmp, c=c: case(tmp, *c)) for c in CASES] + [("refused", refused)]
    return H.run_scenarios(scenarios, "zck-dcp2dcp-")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--fsdp2":
        fsdp2_worker(sys.argv[2])
        H.end_worker()
    sys.exit(main())
