"""interop_fsdp1.py LIBZCKPT: zckpt on FSDP1 (FullyShardedDataParallel) checkpoints, against torch,
DeepSpeed and Accelerate run live.

The fixtures (tests/fixtures/dcp/fsdp1_*, make_dcp_fsdp1_fixtures.py) are what Accelerate's save_state and
the HF Trainer write for an FSDP1 model with SHARDED_STATE_DICT: checkpoint-2/pytorch_model_fsdp_0/ and
optimizer_0/ (FSDP.optim_state_dict), use_orig_params False and True, W=2 and 3, tied and untied.

  read       for each: zckpt.dcp_to_torch_save of pytorch_model_fsdp_0/ = torch's byte for byte (optimizer_0/
             alone is not read: zckpt joins optimizer state to the weights it belongs to; it is checked
             below through reshard against DeepSpeed);
             `zckpt consolidate` = torch's model tensors bit for bit; verify and inspect pass; a byte
             flipped inside an exp_avg chunk (torch returns the changed state silently) is refused by verify
             and reshard in one line naming the file, nothing at OUT.
  to DS      `zckpt reshard checkpoint-2 DS --to-stage S --to-world-size W`: real DeepSpeed (CPU, torch
             AdamW) load_checkpoint's every fp32 master, exp_avg, exp_avg_sq = the FSDP1 optimizer's (torch's
             dcp_to_torch_save of optimizer_0/), Adam's step = its step; DeepSpeed then saves it itself.
  from DS    that DeepSpeed save -> `zckpt reshard --to-format dcp-accelerate --to-world-size W'` (for the
             tied case the Python package's zckpt.reshard(format="dcp-accelerate")) ->
             Accelerate FSDP1 (use_orig_params=False, W' ranks) load_state: the full weights, exp_avg,
             exp_avg_sq, step and param-group settings FSDP1 then holds = the original fixture's, bit for bit.
  other      Accelerate FSDP1 save_state with LOCAL_STATE_DICT (each rank's padded flat-parameter shards):
             inspect, verify, consolidate, reshard refuse the folder in one line naming it and what it is,
             exit 1, nothing at OUT (inspect and verify also a rank file); with FULL_STATE_DICT its
             pytorch_model_fsdp.bin is a plain torch.save: `zckpt convert` = torch.load bit for bit, verify clean.
"""
import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
GEN = os.path.join(SRC, "tests", "fixtures", "gen")
sys.path.insert(0, HERE)
sys.path.insert(0, GEN)
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

ROOT = os.path.join(SRC, "tests", "fixtures", "dcp")
ZCKPT = os.environ.get("ZCK_BIN") or os.path.join(SRC, "build", "bin", "zckpt")
CASES = ["fsdp1_accelerate_untied_w2_fp32", "fsdp1_accelerate_tied_w3_origparams", "fsdp1_hf_trainer_tied_w2_fp32"]
# fixture -> (DeepSpeed stage, ranks) it is resharded to, then the FSDP1 world size it comes back at. The way
# back loads with Accelerate's default use_orig_params=False at W=2: Accelerate 1.16 / torch 2.15 FSDP1 on the
# CPU load torch's own fixtures exactly only so (at W=3 load_state stops at "Missing key in checkpoint
# state_dict: optimizer.param_groups"; with use_orig_params=True the Adam state it holds after load_state is
# not the checkpoint's), so that is where zckpt's output can be held to torch's.
ROUND_TRIPS = {"fsdp1_accelerate_untied_w2_fp32": (2, 1, 2), "fsdp1_accelerate_tied_w3_origparams": (3, 2, 2)}
BACK_PLUGIN = "fsdp1_accelerate_untied_w2_fp32"   # plugin_for: use_orig_params=False
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def setting(v):
    return tuple(v) if isinstance(v, (list, tuple)) else v


def run(*args):
    return subprocess.run([ZCKPT, *args], capture_output=True, text=True)


def torch_full(folder, tmp):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    pt = os.path.join(tmp, "torch_full.pt")
    dcp_to_torch_save(folder, pt)
    sd = torch.load(pt, weights_only=False)
    os.unlink(pt)
    return sd


def reference(case, tmp):
    """The fixture as torch reads it: model weights and the FSDP1 optimizer's state dict."""
    ck = os.path.join(ROOT, case, "checkpoint-2")
    return (torch_full(os.path.join(ck, "pytorch_model_fsdp_0"), tmp)["model"],
            torch_full(os.path.join(ck, "optimizer_0"), tmp)["optimizer"])


# ---- read

def read_checks(tmp):
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as torch_d2t
    from zckpt.dcp import dcp_to_torch_save
    for case in CASES:
        ck = os.path.join(ROOT, case, "checkpoint-2")
        # the same file name: torch names the zip's folder after it
        ref, ours = (os.path.join(tmp, side, f"{case}.pt") for side in ("torch", "zckpt"))
        os.makedirs(os.path.dirname(ref), exist_ok=True)
        os.makedirs(os.path.dirname(ours), exist_ok=True)
        torch_d2t(os.path.join(ck, "pytorch_model_fsdp_0"), ref)
        dcp_to_torch_save(os.path.join(ck, "pytorch_model_fsdp_0"), ours)
        if open(ref, "rb").read() != open(ours, "rb").read():
            fail(f"{case}: zckpt.dcp_to_torch_save differs from torch's file")
        model = torch.load(ref, weights_only=False)["model"]
        out = os.path.join(tmp, case + "-hf")
        r = run("consolidate", "-q", ck, out)
        if r.returncode:
            fail(f"{case}: consolidate: {r.stderr.strip()}")
        else:
            got = load_file(os.path.join(out, "model.safetensors"))
            if set(got) != set(model) or not all(same(got[k], v) for k, v in model.items()):
                fail(f"{case}: consolidate differs from dcp_to_torch_save")
        for cmd in ("verify", "inspect"):
            r = run(cmd, ck)
            if r.returncode:
                fail(f"{case}: {cmd}: {r.stdout[-300:]} {r.stderr.strip()}")
        print(f"{case}: dcp_to_torch_save byte for byte, consolidate bit for bit, verify, inspect")

    case = "fsdp1_accelerate_tied_w3_origparams"
    d = os.path.join(tmp, "flipped")
    shutil.copytree(os.path.join(ROOT, case, "checkpoint-2"), d)
    opt = os.path.join(d, "optimizer_0")
    md = pickle.load(open(os.path.join(opt, ".metadata"), "rb"))
    key = next(k for k in md.storage_data if k.fqn.endswith("embed_tokens.weight.exp_avg") and k.index == 2)
    info = md.storage_data[key]
    path = os.path.join(opt, info.relative_path)
    data = bytearray(open(path, "rb").read())
    item = bytes(data[info.offset:info.offset + info.length])
    raw = torch.load(io.BytesIO(item)).contiguous().view(torch.uint8).numpy().tobytes()
    data[info.offset + item.index(raw) + 3] ^= 0x08
    open(path, "wb").write(data)
    before = torch_full(os.path.join(ROOT, case, "checkpoint-2", "optimizer_0"), tmp)
    after = torch_full(opt, tmp)
    k = "model.embed_tokens.weight"
    if torch.equal(before["optimizer"]["state"][k]["exp_avg"], after["optimizer"]["state"][k]["exp_avg"]):
        fail("flipped: torch's dcp_to_torch_save saw no change (the test is wrong)")
    # (consolidate copies no optimizer state: it checks the structure of optimizer_0/, not its bytes)
    for args in (["verify", d],
                 ["reshard", "-q", d, os.path.join(tmp, "flipped-ds"), "--to-stage", "2", "--to-world-size", "1"]):
        r = run(*args)
        said = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith(("damaged:", "zckpt: error:"))]
        if r.returncode == 0 or len(said) != 1 or info.relative_path not in said[0]:
            fail(f"flipped: `zckpt {args[0]}` rc {r.returncode}, did not say it in one line naming the file: {said}")
        if len(args) > 3 and os.path.exists(args[3]):
            fail(f"flipped: `zckpt {args[0]}` left {args[3]}")
    print("flipped byte in optimizer_0: torch returns the changed exp_avg; verify and reshard refuse it")


# ---- DeepSpeed side (one process per rank)

def ds_worker(spec_path):
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    import make_dcp_fixtures as M
    spec = json.load(open(spec_path))
    deepspeed.init_distributed(dist_backend="gloo")
    model = M.build_model(spec["tied"], "fp32")
    named = dict(model.named_parameters())
    groups = [{"params": [named[n] for n in g]} for g in spec["groups"]]
    cfg = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**6,
           "zero_optimization": {"stage": spec["stage"]},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    path, _ = engine.load_checkpoint(spec["load"], load_lr_scheduler_states=False)
    if path is None:
        raise RuntimeError(f"load_checkpoint({spec['load']}) returned None")
    opt = engine.optimizer
    if spec["stage"] < 3:
        opt._hp_optimizer_states_linked = False   # link the state fragments now (ds_harness.snapshot says why)
        opt._lazy_init_hp_params_optimizer_state()
    res = {"params": {}, "step": None, "groups": []}
    for n, p in engine.module.named_parameters():
        res["params"][n] = {"fp32": safe_get_full_fp32_param(p).detach().clone()}
        for k in ("exp_avg", "exp_avg_sq"):
            res["params"][n][k] = safe_get_full_optimizer_state(p, k).detach().clone()
    inner = opt.optimizer if hasattr(opt, "optimizer") else opt
    st = next(iter(inner.state.values()))
    res["step"] = float(st["step"])
    res["groups"] = [{k: v for k, v in g.items() if k != "params"} for g in inner.param_groups]
    engine.save_checkpoint(spec["save"])
    if int(os.environ["RANK"]) == 0:
        torch.save(res, spec["out"])


# ---- Accelerate FSDP1 side

def fsdp1_worker(spec_path):
    from accelerate import Accelerator
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    import make_dcp_fixtures as M
    from make_dcp_fsdp1_fixtures import fsdp1_on_cpu, plugin_for
    spec = json.load(open(spec_path))
    plugin = plugin_for(spec["case"])
    acc = Accelerator(cpu=True, fsdp_plugin=plugin)
    fsdp1_on_cpu(acc, plugin)
    model = acc.prepare(M.build_model(spec["tied"], "fp32"))
    opt = acc.prepare(torch.optim.AdamW(model.parameters(), lr=0.0, betas=(0.5, 0.5), weight_decay=0.5))
    # FSDP.optim_state_dict of an optimizer with no state yet is empty, and dcp.load fills only the
    # entries it is given: one step at lr 0 makes them (as a loop that resumes after its first step)
    ids = torch.zeros(1, 2, dtype=torch.long)
    acc.backward(model(input_ids=ids, labels=ids).loss)
    opt.step()
    opt.zero_grad()
    acc.load_state(spec["load"])
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False),
                              FullOptimStateDictConfig(rank0_only=False)):
        msd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        osd = FSDP.optim_state_dict(model, opt)
    if acc.process_index == 0:
        torch.save({"model": msd, "optim": osd}, spec["out"])
    acc.wait_for_everyone()


def other_saves_worker(spec_path):
    """Accelerate FSDP1 save_state with LOCAL_STATE_DICT, then FULL_STATE_DICT."""
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    import make_dcp_fixtures as M
    from make_dcp_fsdp1_fixtures import fsdp1_on_cpu
    spec = json.load(open(spec_path))
    plugin = FullyShardedDataParallelPlugin(fsdp_version=1, state_dict_type="LOCAL_STATE_DICT",
                                            auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["LlamaDecoderLayer"])
    acc = Accelerator(cpu=True, fsdp_plugin=plugin)
    fsdp1_on_cpu(acc, plugin)
    model = acc.prepare(M.build_model(False, "fp32"))
    opt = acc.prepare(torch.optim.AdamW(model.parameters(), lr=1e-2))
    ids = torch.zeros(1, 4, dtype=torch.long)
    acc.backward(model(input_ids=ids, labels=ids).loss)
    opt.step()
    acc.save_state(spec["local"])
    plugin.state_dict_config = plugin.optim_state_dict_config = None
    plugin.set_state_dict_type("FULL_STATE_DICT")
    acc.save_state(spec["full"])


def other_saves(tmp):
    """LOCAL_STATE_DICT refused in one line by every job; FULL_STATE_DICT's pytorch_model_fsdp.bin read."""
    from safetensors.torch import load_file
    spec = {"local": os.path.join(tmp, "local"), "full": os.path.join(tmp, "full"), "out": os.path.join(tmp, "other")}
    err = launch(2, "--other", spec, tmp, "other")
    if err:
        return fail(f"LOCAL/FULL_STATE_DICT saves: {err}")
    local, out = spec["local"], os.path.join(tmp, "local-out")
    for target in (local, os.path.join(local, "pytorch_model_fsdp_rank0.bin")):
        for args in (["inspect", target], ["verify", target], ["consolidate", "-q", target, out],
                     ["reshard", "-q", target, out, "--to-stage", "2"]):
            r = run(*args)
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
            if args[0] in ("consolidate", "reshard") and target.endswith(".bin"):
                continue   # a file is not a checkpoint folder: they say so
            if r.returncode != 1 or len(lines) != 1 or "LOCAL_STATE_DICT" not in lines[0] or target not in lines[0]:
                fail(f"LOCAL_STATE_DICT: `zckpt {args[0]} {target}`: rc {r.returncode}, {r.stdout[-200:]} {r.stderr!r}")
            if os.path.exists(out):
                fail(f"LOCAL_STATE_DICT: `zckpt {args[0]}` left {out}")
    full = os.path.join(spec["full"], "pytorch_model_fsdp.bin")
    st = os.path.join(tmp, "full.safetensors")
    r = run("convert", full, st)
    if r.returncode:
        return fail(f"FULL_STATE_DICT: convert: {r.stderr.strip()}")
    want, got = torch.load(full, weights_only=True), load_file(st)
    if set(want) != set(got) or not all(same(got[k], v) for k, v in want.items()):
        fail("FULL_STATE_DICT: convert of pytorch_model_fsdp.bin differs from torch.load's")
    r = run("verify", full)
    if r.returncode:
        fail(f"FULL_STATE_DICT: verify {full}: {r.stdout[-200:]}")
    print("LOCAL_STATE_DICT refused in one line by inspect, verify, consolidate, reshard; FULL_STATE_DICT's "
          "pytorch_model_fsdp.bin converted = torch.load bit for bit")


def launch(world, flag, spec, tmp, name):
    from ds_launch import launch as ds_launch
    import ds_harness as H
    with open(spec["out"] + ".json", "w") as f:
        json.dump(spec, f)
    logs = os.path.join(tmp, name)
    rc = ds_launch(world, [os.path.abspath(__file__), flag, spec["out"] + ".json"], log_prefix=logs, timeout=300)
    return None if rc == 0 else f"exit {rc}: {H.error_of(logs, world)}"


def round_trip(tmp, case, stage, ds_world, back_world):
    model, osd = reference(case, tmp)
    tied = json.load(open(os.path.join(ROOT, case, "expected.json")))["case"]["tied"]
    label = f"{case}: -> DeepSpeed ZeRO-{stage} W={ds_world}"
    ds = os.path.join(tmp, case + ".ds")
    r = run("reshard", "-q", os.path.join(ROOT, case, "checkpoint-2"), ds, "--to-stage", str(stage),
            "--to-world-size", str(ds_world))
    if r.returncode:
        return fail(f"{label}: reshard: {r.stderr.strip()}")
    saved = os.path.join(tmp, case + ".ds-saved")
    spec = {"load": ds, "save": saved, "tied": tied, "stage": stage, "out": os.path.join(tmp, case + ".ds.pt"),
            "groups": [g["params"] for g in osd["param_groups"]]}
    err = launch(ds_world, "--ds", spec, tmp, case + ".ds")
    if err:
        return fail(f"{label}: DeepSpeed: {err}")
    got = torch.load(spec["out"], weights_only=False)
    if sorted(got["params"]) != sorted(osd["state"]):
        fail(f"{label}: DeepSpeed's params {sorted(got['params'])} != the FSDP1 optimizer's {sorted(osd['state'])}")
    for n, g in got["params"].items():
        if n in osd["state"]:
            if not same(g["fp32"], model[n]):
                fail(f"{label}: {n}: fp32 master != the FSDP1 weight")
            for k in ("exp_avg", "exp_avg_sq"):
                if not same(g[k], osd["state"][n][k]):
                    fail(f"{label}: {n}: {k} != the FSDP1 optimizer's")
    steps = {float(s["step"]) for s in osd["state"].values()}
    if steps != {got["step"]}:
        fail(f"{label}: DeepSpeed's Adam step {got['step']} != FSDP1's {steps}")
    for k in ("lr", "betas", "eps", "weight_decay"):
        if setting(got["groups"][0][k]) != setting(osd["param_groups"][0][k]):
            fail(f"{label}: group setting {k} {got['groups'][0][k]} != FSDP1's {osd['param_groups'][0][k]}")
    if not [f for f in failures if f.startswith(label)]:
        print(f"{label}: DeepSpeed loads it, fp32 masters, exp_avg, exp_avg_sq, step = the FSDP1 optimizer's")

    label = f"{case}: DeepSpeed's save -> dcp-accelerate -> Accelerate FSDP1 W={back_world}"
    back = os.path.join(tmp, case + ".back")
    if tied:   # the Python package's zckpt.reshard(format="dcp-accelerate") is the same job
        import zckpt
        try:
            zckpt.reshard(saved, back, format="dcp-accelerate", world_size=back_world)
        except zckpt.Error as e:
            return fail(f"{label}: zckpt.reshard: {e}")
    else:
        r = run("reshard", "-q", saved, back, "--to-format", "dcp-accelerate", "--to-world-size", str(back_world))
        if r.returncode:
            return fail(f"{label}: reshard: {r.stderr.strip()}")
    spec = {"case": BACK_PLUGIN, "tied": tied, "load": back,
            "out": os.path.join(tmp, case + ".back.pt")}
    err = launch(back_world, "--fsdp1", spec, tmp, case + ".back")
    if err:
        return fail(f"{label}: Accelerate load_state: {err}")
    got = torch.load(spec["out"], weights_only=False)
    for n, t in model.items():
        if n not in got["model"]:
            if not (tied and n == "lm_head.weight"):
                fail(f"{label}: {n} missing from the loaded model")
        elif not same(got["model"][n], t):
            fail(f"{label}: weight {n} differs")
    gs = got["optim"]["state"]
    if sorted(gs) != sorted(osd["state"]):
        fail(f"{label}: loaded optimizer params {sorted(gs)} != {sorted(osd['state'])}")
    for n, st in osd["state"].items():
        for k, v in st.items():
            if n in gs and not same(gs[n][k], v):
                fail(f"{label}: {n}.{k} differs ({gs[n][k].flatten()[:3]} vs {v.flatten()[:3]})")
    for k, v in osd["param_groups"][0].items():
        g = got["optim"]["param_groups"][0].get(k)
        if k != "params" and setting(g) != setting(v):
            fail(f"{label}: param group {k} = {g}, the fixture's {v}")
    if not [f for f in failures if f.startswith(label)]:
        print(f"{label}: weights, exp_avg, exp_avg_sq, step, group settings = the fixture's bit for bit")


def main():
    os.environ["ZCKPT_LIBRARY"] = sys.argv[1]
    sys.path.insert(0, os.path.join(SRC, "python"))
    if not os.path.exists(ZCKPT):
        print(f"skip: no zckpt binary at {ZCKPT}")
        return 77
    with tempfile.TemporaryDirectory(prefix="zck-fsdp1-") as tmp:
        read_checks(tmp)
        for case, (stage, ds_world, back_world) in ROUND_TRIPS.items():
            round_trip(tmp, case, stage, ds_world, back_world)
        other_saves(tmp)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--ds", "--fsdp1", "--other"):
        {"--ds": ds_worker, "--fsdp1": fsdp1_worker, "--other": other_saves_worker}[sys.argv[1]](sys.argv[2])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    sys.exit(main())
