"""interop_dcp_write.py: torch FSDP2 resumes from `zckpt reshard --to-format dcp` of a DeepSpeed run.

Each source trains the fixture model (tests/fixtures/gen/make_deepspeed_fixtures.py: a tied embedding / head,
a frozen Linear, a 1-element param, buffers, two param groups) under real DeepSpeed on the CPU (gloo, 2 ranks,
torch AdamW, WarmupLR, gradient clipping 1.0) for STEPS steps, saves, and keeps training (the uninterrupted
run). `zckpt reshard SRC OUT --to-format dcp --to-world-size W` converts the save; then W processes build the
same model under FSDP2 (init_device_mesh("cpu", (W,)), fully_shard, torch AdamW over the same groups), take
get_state_dict, dcp.load the converted folder into it and set_state_dict. Checked on every rank:

  state      every trainable param's weight, exp_avg, exp_avg_sq: torch.equal DeepSpeed's full fp32 master and
             Adam state (safe_get_full_*); Adam's step == DeepSpeed's; the frozen param and the persistent
             buffers == DeepSpeed's (16-bit values widened); tied weights still one tensor
  groups     every param group's settings (lr, betas, eps, weight_decay, ...) == DeepSpeed's
  next loss  the loss of the next step's global batch, computed on DeepSpeed's per-rank slices and averaged
             as it averages them: == the uninterrupted run's (fp32), within bf16 rounding (bf16)
  a step     one AdamW step (clipped at 1.0, the loaded lr): the loss after it agrees with the uninterrupted
             run's second loss within LOSS_RTOL (only the gradient reduction order differs)

Damage: a byte flipped inside a tensor of the source's optimizer file is refused by the conversion in one line
naming the file, exit 1, nothing at OUT.

Prints `N passed, M failed`; exits 0 only if every scenario passes (77 without a zckpt binary).
Usage: interop_dcp_write.py [SCENARIO...]   (ZCK_BIN = the zckpt binary)
"""
import functools
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch  # noqa: E402
import ds_harness as H  # noqa: E402
import fsdp2_harness as F  # noqa: E402

STEPS, MORE = 2, 2
LOSS_RTOL = {"fp32": 1e-4, "bf16": 3e-2}

# (source stage, source dtype, FSDP2 world sizes to load at); the DeepSpeed sources run at W=2
SOURCES = [(3, "fp32", (2, 3)), (2, "bf16", (3,))]


# ---- the FSDP2 side (one process per rank, launched by ds_launch)

def fsdp2_worker(spec_path):
    import torch.distributed as dist

    with open(spec_path) as f:
        spec = json.load(f)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ref = torch.load(spec["ref"], weights_only=False)
    model, opt = F.build(world, spec["dtype"])
    F.load_dcp(model, opt, spec["dcp"])

    probs = []
    full = F.full
    named = dict(model.named_parameters())
    for n, want in ref["gathered"].items():
        p = named[n]
        if not torch.equal(full(p), want["fp32"]):
            probs.append(f"{n}: weight differs from DeepSpeed's fp32 master")
        st = opt.state.get(p, {})
        for k in ("exp_avg", "exp_avg_sq"):
            if k not in st or not torch.equal(full(st[k]), want[k]):
                probs.append(f"{n}: {k} differs from DeepSpeed's")
        if "step" not in st or float(st["step"]) != float(ref["step"]):
            probs.append(f"{n}: step {st.get('step')} != DeepSpeed's {ref['step']}")
    if model.head.weight is not model.embed.weight:
        probs.append("head.weight is no longer embed.weight")
    want_frozen = ref["lp"]["frozen.weight"].float()
    if not torch.equal(full(model.frozen.weight).float(), want_frozen):
        probs.append("frozen.weight differs from DeepSpeed's")
    for b in ("shift", "counter"):
        got, want = getattr(model, b), ref["lp"][b]
        if not torch.equal(got.to(want.dtype), want):
            probs.append(f"buffer {b}: {got.tolist()} != DeepSpeed's {want.tolist()}")
    probs += H.group_settings_problems(opt.param_groups, ref["param_groups"], "DeepSpeed")

    loss = F.ds_loss(model, STEPS, ref["ds_world"])
    want = ref["losses"][0]
    if spec["dtype"] == "fp32" and loss != want:
        probs.append(f"next loss {loss!r} != the uninterrupted run's {want!r}")
    if spec["dtype"] == "bf16" and abs(loss - want) > LOSS_RTOL["bf16"] * abs(want):
        probs.append(f"next loss {loss!r} vs the uninterrupted run's {want!r}: beyond bf16 rounding")
    # one step on this world size's split of the same global batch, then the next loss
    F.train_step(model, opt, STEPS, rank, world)
    loss2, want2 = F.ds_loss(model, STEPS + 1, ref["ds_world"]), ref["losses"][1]
    if abs(loss2 - want2) > LOSS_RTOL[spec["dtype"]] * abs(want2):
        probs.append(f"loss after one FSDP2 step {loss2!r} vs the uninterrupted run's {want2!r}")
    with open(f"{spec['out']}.rank{rank}.json", "w") as f:
        json.dump({"problems": probs, "loss": loss, "loss2": loss2}, f)
    dist.barrier()
    dist.destroy_process_group()


def run_fsdp2(tmp, name, world, dcp_dir, ref_path, dtype):
    probs, res = F.launch(tmp, name, world, __file__, {"dcp": dcp_dir, "ref": ref_path, "dtype": dtype})
    return probs, res[0] if res else None


# ---- the DeepSpeed side and the checks

def reference(res):
    """What the FSDP2 ranks compare with: DeepSpeed's full state right after the save, and the losses after it."""
    snap = res[0]["snap"]
    step = snap["parts"][0]["step"]
    return {"gathered": snap["gathered"], "lp": snap["lp"], "param_groups": snap["param_groups"],
            "step": float(step), "losses": res[0]["losses"], "ds_world": len(res)}


def damaged(tmp, src_root):
    """A flipped byte in a tensor of rank 1's optimizer file: refused in one line, nothing at OUT."""
    bad = os.path.join(tmp, "damaged")
    shutil.copytree(src_root, bad)
    tag = open(os.path.join(bad, "latest")).read().strip()
    optim = sorted(f for f in os.listdir(os.path.join(bad, tag)) if f.endswith("optim_states.pt"))[1]
    path = os.path.join(bad, tag, optim)
    import zipfile
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset)
        head = f.read(30)
        start = info.header_offset + 30 + int.from_bytes(head[26:28], "little") + int.from_bytes(head[28:30], "little")
        f.seek(start + info.file_size // 2)
        b = f.read(1)
        f.seek(start + info.file_size // 2)
        f.write(bytes([b[0] ^ 0x10]))
    out = os.path.join(tmp, "damaged.dcp")
    r = subprocess.run([H.ZCKPT, "reshard", "-q", bad, out, "--to-format", "dcp", "--to-world-size", "3"],
                       capture_output=True, text=True)
    probs = []
    lines = r.stderr.strip().splitlines()
    if r.returncode != 1:
        probs.append(f"damaged source: exit {r.returncode}, expected 1")
    if len(lines) != 1 or optim not in lines[0] or "CRC" not in lines[0]:
        probs.append(f"damaged source: expected one line naming {optim} and its CRC, got {r.stderr.strip()!r}")
    if os.path.exists(out) or any(n.startswith(".damaged.dcp") for n in os.listdir(tmp)):
        probs.append("damaged source: something was left at OUT")
    return probs


def scenario(tmp, stage, dtype, worlds):
    name = f"s{stage}w2_{dtype}"
    src = os.path.join(tmp, name)
    res = H.run(tmp, name, 2, mode="train", stage=stage, dtype=dtype, steps=STEPS, more=MORE, save_dir=src,
                perturb_frozen=True)
    ref_path = os.path.join(tmp, name + ".ref.pt")
    torch.save(reference(res), ref_path)
    results = []
    for w in worlds:
        out = os.path.join(tmp, f"{name}.dcp{w}")
        r = subprocess.run([H.ZCKPT, "reshard", "-q", src, out, "--to-format", "dcp", "--to-world-size", str(w)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            results.append((f"{name} -> FSDP2 W={w}", [f"zckpt reshard failed: {r.stderr.strip()}"]))
            continue
        probs, res0 = run_fsdp2(tmp, f"{name}.fsdp{w}", w, out, ref_path, dtype)
        note = f" (next loss {res0['loss']:.7g}, after a step {res0['loss2']:.7g})" if res0 else ""
        results.append((f"{name} -> FSDP2 W={w}{note}", probs))
    if stage == 3:
        results.append((f"{name} damaged -> refused", damaged(tmp, src)))
    return results


def main(argv):
    if not os.path.exists(H.ZCKPT):
        print(f"skip: no zckpt binary at {H.ZCKPT}")
        return 77
    scenarios = [(f"s{stage}w2_{dtype}", functools.partial(scenario, stage=stage, dtype=dtype, worlds=worlds))
                 for stage, dtype, worlds in SOURCES]
    return H.run_scenarios(scenarios, "zck-dcpw-", set(argv))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--fsdp2":
        fsdp2_worker(sys.argv[2])
        H.end_worker()
    sys.exit(main(sys.argv[1:]))
