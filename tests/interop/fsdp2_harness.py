"""fsdp2_harness.py: the DeepSpeed fixture model (ds_harness.fixture) under torch FSDP2 on the CPU, for the
DeepSpeed <-> DCP interop tests (interop_dcp_write.py, interop_dcp_to_ds.py).

  build(world, dtype)   the fixture model, fully_shard over init_device_mesh("cpu", (world,)) (bf16: a
                        MixedPrecisionPolicy computing in bf16 over fp32 params, as FSDP2 mixed precision
                        does), and torch AdamW over the fixture's param groups (lr 0.01, betas (0.9, 0.999),
                        eps 1e-8: the fixture ds_config's)
  load_dcp(model, opt, path)   dcp.load of a {"model", "optim"} DCP into both (get_state_dict / set_state_dict)
  full(t)               a DTensor's full tensor (a plain tensor as it is), detached
  ds_loss(model, k, w)  the loss DeepSpeed logs for step k at world size w: each of its ranks' slice of the
                        global batch (ds_harness.batch), averaged as its all-reduce averages them
  train_step(model, opt, k, rank, world)   one step on this rank's slice, gradients clipped at 1.0 as the
                        fixture ds_config clips them
  launch(tmp, name, world, script, spec)   runs `script --fsdp2 SPEC` on `world` processes (gloo); returns
                        (problems, per-rank results): each rank writes SPEC["out"].rank<r>.json
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ds_harness as H  # noqa: E402


def build(world, dtype):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    m = H.fixture()
    model = m.build_model()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if dtype == "bf16" else MixedPrecisionPolicy()
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)), mp_policy=mp)
    groups = [{"params": [p for _, p in ps], "weight_decay": wd} for _, wd, ps in m.param_groups_spec(model)]
    opt = torch.optim.AdamW(groups, lr=0.01, betas=(0.9, 0.999), eps=1e-8)
    return model, opt


def load_dcp(model, opt, path):
    """dcp.load of a {"model", "optim"} DCP into model and opt, through get_state_dict / set_state_dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    msd, osd = get_state_dict(model, opt)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()


def ds_loss(model, k, ds_world):
    import torch
    total = torch.zeros((), dtype=torch.float32)
    for r in range(ds_world):
        ids, tgt = H.batch(k, r, ds_world)
        total += model(ids, tgt).detach().float()
    return (total / ds_world).item()


def train_step(model, opt, k, rank, world):
    import torch
    ids, tgt = H.batch(k, rank, world)
    model(ids, tgt).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()


def launch(tmp, name, world, script, spec):
    spec = dict(spec, out=os.path.join(tmp, name))
    err = H.launch_spec(script, "--fsdp2", os.path.join(tmp, name + ".json"), spec, world,
                        os.path.join(tmp, name + ".log"), 300)
    if err:
        return [f"FSDP2 ranks failed: {err}"], None
    res = [json.load(open(f"{spec['out']}.rank{r}.json")) for r in range(world)]
    return sorted({p for r in res for p in r.get("problems", [])}), res
