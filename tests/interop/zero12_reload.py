"""zero12_reload.py: the steps of a test that reshards a ZeRO-1/2 checkpoint and has DeepSpeed load it, compared with
what DeepSpeed itself saved (interop_legacy_moe_reshard, interop_pipeline_reshard).

    per_param(names, numels, flat)       {name: 1-D slice} of a group's full flat partition (padding at the end)
    saved_states(load, model, osd_files) each param's fp32 master, exp_avg, exp_avg_sq and Adam step, cut from one
                                         mp_rank's model file and its dp ranks' optimizer files (in dp order)
    run_ranks(script, tmp, name, spec, world)   `script --worker SPEC` on `world` ranks (ds_launch): (states, each
                                         rank's next loss in rank order), or (None, why) with the ranks' logs or
                                         DeepSpeed's refusal
    check_readback(zck, check, name, src, out)  zckpt reads the output back: verify clean, consolidate = the source's
    check_loaded(check, name, ref, states, n_masters, lp_from)  after load_checkpoint, every state and 16-bit weight
                                         equals the reference bit for bit
"""
import json
import os

STATES = ("fp32", "exp_avg", "exp_avg_sq")


def per_param(names, numels, flat):
    out, off = {}, 0
    for n, k in zip(names, numels):
        out[n] = flat[off:off + k].clone()
        off += k
    return out


def zero_rank(f):
    """The dp rank of a [bf16_]zero_pp_rank_<d>_mp_rank_<m>_optim_states.pt file name."""
    return int(f.split("zero_pp_rank_")[1].split("_")[0])


def saved_states(load, model, osd_files):
    """{state: {name: tensor}} of one mp_rank's flat groups (params in its param_shapes order)."""
    import torch
    osds = [load(f)["optimizer_state_dict"] for f in sorted(osd_files, key=zero_rank)]
    ref = {"fp32": {}, "exp_avg": {}, "exp_avg_sq": {}, "step": {}}
    for i, shapes in enumerate(model["param_shapes"]):
        numels = [int(torch.Size(s).numel()) for s in shapes.values()]
        flats = {"fp32": torch.cat([o["single_partition_of_fp32_groups"][i] for o in osds])}
        for key in ("exp_avg", "exp_avg_sq"):
            flats[key] = torch.cat([o["base_optimizer_state"]["state"][i][key] for o in osds])
        for key in STATES:
            ref[key].update(per_param(list(shapes), numels, flats[key]))
        ref["step"].update({n: float(osds[0]["base_optimizer_state"]["state"][i]["step"]) for n in shapes})
    return ref


def run_ranks(script, tmp, name, spec, world):
    import torch
    from ds_launch import launch
    spec_path, out = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".out")
    json.dump({**spec, "out": out}, open(spec_path, "w"))
    rc = launch(world, [os.path.abspath(script), "--worker", spec_path], timeout=600, log_prefix=os.path.join(tmp, name))
    res = [json.load(open(f"{out}.{r}")) for r in range(world) if os.path.exists(f"{out}.{r}")]
    if rc or len(res) != world:
        logs = "".join(open(os.path.join(tmp, f"{name}.rank{r}.log")).read()[-1200:] for r in range(world)
                       if os.path.exists(os.path.join(tmp, f"{name}.rank{r}.log")))
        return None, f"the ranks failed (rc {rc}): {logs}"
    errs = [x["error"] for x in res if "error" in x]
    if errs:
        return None, f"DeepSpeed's load_checkpoint refuses it: {errs[0]}"
    return torch.load(out + ".states.pt", weights_only=False), [x["loss"] for x in sorted(res, key=lambda x: x["rank"])]


def check_readback(zck, check, name, src, out):
    import torch
    from safetensors.torch import load_file
    v = zck("verify", out)
    check(v.returncode == 0 and "result: clean" in v.stdout, f"{name}: verify: {v.stdout[-600:]} {v.stderr}")
    a, b = zck("consolidate", "-q", src, out + ".a.safetensors"), zck("consolidate", "-q", out, out + ".b.safetensors")
    ok = a.returncode == 0 and b.returncode == 0
    if ok:
        x, y = load_file(out + ".a.safetensors"), load_file(out + ".b.safetensors")
        ok = set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x)
    check(ok, f"{name}: consolidate of the output differs from the source's: {a.stderr} {b.stderr}")


def check_loaded(check, name, ref, states, n_masters, lp_from):
    import torch
    for key in (*STATES, "step"):
        got, want = states.get(key, {}), ref[key]
        bad = [n for n in want if n not in got or (got[n] != want[n] if key == "step" else
                                                   not torch.equal(got[n], want[n]))]
        check(not bad and set(got) == set(want), f"{name}: {key} after load differs from the source's: {bad[:4]}")
    bad = [n for n, t in ref["lp"].items() if n not in states["lp"] or states["lp"][n].dtype != t.dtype
           or not torch.equal(states["lp"][n], t)]
    check(not bad and len(states["lp"]) == len(ref["lp"]) == n_masters,
          f"{name}: 16-bit weights after load differ from the source's {lp_from}: {bad[:4]}")
