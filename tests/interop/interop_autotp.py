"""interop_autotp.py: DeepSpeed's AutoTP checkpoints through zckpt, checked against DeepSpeed itself.

Sources: the real AutoTP checkpoints of tests/fixtures/autotp (DeepSpeed 0.19.8 on the CPU, made by
tests/fixtures/gen/make_autotp_fixtures.py, whose model, data and ds_config are imported here). Per case:

  to-universal  `zckpt to-universal` == DeepSpeed's own ds_to_universal.py of the same folder, file by file
                (every zero/<param>/<state>.pt, step.pt, optimizer_state.pt, the copied mp_rank_* files), except
                the tied head: ds_to_universal writes TP rank 0's 16-bit half ([V/2, H]), zckpt the whole matrix,
                which equals the embedding's fp32 master.
  read back    zckpt reshard of either universal folder (zckpt's, ds_to_universal's) into plain ZeRO, and into AutoTP
                files at the same TP size, == the direct reshard of the AutoTP checkpoint, file for file.
  load (TP)     a fresh AutoTP engine (same TP size, dp 1: from dp 2 too) with checkpoint.load_universal loads
                zckpt's universal folder: its gathered fp32 masters equal the source engine's (expected_fp32)
                bit for bit, and the next step's loss equals the source engine's third step (same data).
  load (TP 1)   `zckpt reshard --to-tp-size 1 --to-stage S --to-world-size DP` (S: 3 from ZeRO-1, else 2) into plain ZeRO, loaded by a plain DeepSpeed
                engine (no tensor_parallel) with engine.load_checkpoint: fp32 masters, exp_avg, exp_avg_sq equal
                the source engine's (expected_fp32 / expected_state) bit for bit; the next loss equals the
                source's third step to LOSS_RTOL (same data per dp rank; TP changes the summation order).

  AutoTP files  `zckpt reshard --to-tp-size T` (the source's TP size): at the source's stage and dp size, every file equals
                DeepSpeed's own object for object; at another stage and dp size, the TP 1 files above resharded back to
                TP T (DeepSpeed's split from the model's config.json) equal the direct reshard byte for byte, and
                DeepSpeed's AutoTP engine at (T, new dp) loads them with engine.load_checkpoint: fp32 masters,
                exp_avg, exp_avg_sq bit for bit, next loss as above, and the universal_checkpoint_info the files carry
                equals the one the engine builds itself (TP 2 x DP 2 and TP 1 x DP 2 sources).
  other layouts (check_map: TP 4 x 2 kv heads, mistral, qwen2 with tp_grain_size 8) zckpt's AutoTP files at the
                source's own layout = DeepSpeed's, object for object; qwen2 from TP 2 to TP 4 (its affine map; the
                2 kv heads leave TP ranks 2 and 3 empty attention shards, saved as frozen zero-element params there,
                as DeepSpeed does; rank 3 gets no MLP grain) is loaded by DeepSpeed's engine at TP 4: masters and
                Adam state bit for bit, its own universal_checkpoint_info, the next loss; zckpt's universal folder of the TP 4 x 2 kv heads case
                (ds_to_universal fails on its empty shards) by load_universal at TP 4, state bit for bit.

  frozen        (the `_frozen` cases, check_frozen) AutoTP files at the source's own layout = DeepSpeed's, object for
                object; DeepSpeed's AutoTP engine loads zckpt's reshard into ZeRO-3 AutoTP files:
                masters, Adam state and the frozen params bit for bit, next loss as above.

Prints `N passed, M failed`; exits 0 only if all pass (77 without a zckpt binary or the fixtures).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
GEN = os.path.join(SRC, "tests", "fixtures", "gen")
FIX = os.path.join(SRC, "tests", "fixtures", "autotp")
sys.path.insert(0, GEN)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, HERE)
import ds_harness as H  # noqa: E402

ZCKPT = H.ZCKPT
LOSS_RTOL = {"fp32": 1e-5, "bf16": 2e-2}
# the default run (about 2 minutes on 2 cores): TP 2 x DP 1 fp32 ZeRO-1 tied, TP 2 x DP 2 bf16 ZeRO-3 tied (ZeRO-2
# files are ZeRO-1's format: test_autotp covers them against the live engine; pass a case name to run any other)
CASES = ["tp2_s1_fp32_tied", "tp2dp2_s3_bf16_tied", "tp2_s2_bf16_tied_frozen", "tp4_s2_bf16_tied_kv2",
         "tp2_s1_fp32_untied_mistral", "tp2_s2_bf16_tied_qwen2_grain8"]
MAP_CASES = CASES[3:]


def worker(spec_path):
    """One rank of a load: build the engine, load, gather, take the next step."""
    import torch
    import deepspeed
    import deepspeed.comm as dist
    import make_autotp_fixtures as G
    from deepspeed.utils import groups, safe_get_full_fp32_param, safe_get_full_optimizer_state
    with open(spec_path) as f:
        spec = json.load(f)
    deepspeed.init_distributed(dist_backend="gloo")
    if spec.get("case"):  # the fixture's model (mistral, qwen2, ...)
        model = G.case_model(spec["case"])
    else:
        model = G.build_model(spec["tied"])
    if spec.get("frozen"):  # the frozen cases' params, frozen as the source engine's were
        for n, p in model.named_parameters():
            p.requires_grad_(not any(k in n for k in G.FROZEN))
    tp = spec["tp"]
    cfg = G.ds_config(spec["world"], max(tp, 1), spec["stage"], spec["dtype"])
    if tp <= 1:
        del cfg["tensor_parallel"]
    elif spec.get("grain"):
        cfg["tensor_parallel"]["tp"] = {"tp_grain_size": spec["grain"]}
    if spec["universal"]:
        cfg["checkpoint"] = {"load_universal": True}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    path, _ = engine.load_checkpoint(spec["load"])
    assert path is not None, "load_checkpoint found nothing"
    dp_rank = groups._get_data_parallel_rank()
    # stage 1/2: after a load the optimizer-state fragments are linked only at the next step: link them now
    # (only views; as tests/interop/ds_harness.py does)
    opt = engine.optimizer
    if hasattr(opt, "_lazy_init_hp_params_optimizer_state") and getattr(opt, "optimizer", opt).state:
        opt._hp_optimizer_states_linked = False
        opt._lazy_init_hp_params_optimizer_state()
    frozen = {}
    if tp > 1:
        full = {k: G.gather_full(engine, safe_get_full_fp32_param) for k in ["fp32"]}["fp32"]
        state = {}
        for key in ("exp_avg", "exp_avg_sq"):
            for n, t in G.gather_full(engine, lambda p, k=key: safe_get_full_optimizer_state(p, k)).items():
                state[f"{n}/{key}"] = t
        if spec.get("frozen"):  # the frozen params' slices, merged by the affine map
            frozen = G.gather_full(engine, None)
    else:
        full, state, seen = {}, {}, set()
        for n, p in engine.module.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if not p.requires_grad:  # stage 1/2: the module holds it whole
                frozen[n] = p.detach().clone()
                continue
            full[n] = safe_get_full_fp32_param(p).detach().clone()
            for key in ("exp_avg", "exp_avg_sq"):
                state[f"{n}/{key}"] = safe_get_full_optimizer_state(p, key).detach().clone()
    uci_same = None
    if tp > 1 and not spec["universal"]:
        # the universal_checkpoint_info of the files loaded (zckpt's: at another TP size, built from DeepSpeed's split
        # rules and the model config) == the one this engine builds at its own TP size
        from deepspeed.checkpoint.constants import UNIVERSAL_CHECKPOINT_INFO
        with open(os.path.join(spec["load"], "latest")) as f:
            tag_dir = os.path.join(spec["load"], f.read().strip())
        mfile = sorted(n for n in os.listdir(tag_dir) if n.endswith("mp_rank_00_model_states.pt"))[0]
        saved = torch.load(os.path.join(tag_dir, mfile), weights_only=False)["universal_checkpoint_info"]
        uci_same = saved == getattr(engine.module, UNIVERSAL_CHECKPOINT_INFO)
    loss = G.train_step(engine, 2, dp_rank)
    losses = [None] * dist.get_world_size()
    dist.all_gather_object(losses, loss)
    if dist.get_rank() == 0:
        torch.save({"fp32": full, "state": state, "frozen": frozen, "losses": losses,
                    "global_steps": engine.global_steps, "uci_same": uci_same},
                   spec["out"])
    dist.barrier()


def run_load(tmp, name, spec):
    spec["out"] = os.path.join(tmp, name + ".result.pt")
    err = H.launch_spec(__file__, "--worker", os.path.join(tmp, name + ".spec.json"), spec, spec["world"],
                        os.path.join(tmp, name), 600)
    if err:
        raise AssertionError(f"{name}: DeepSpeed load failed: {err}")
    import torch
    return torch.load(spec["out"], weights_only=False)


def load_st(path):
    from safetensors.torch import load
    with open(path, "rb") as f:
        return load(f.read())


bits_equal, same_obj = H.bits_equal, H.same_obj


def identity_problems(case, ident, exp, what="identity"):
    """zckpt's reshard of the case to its own TP size, stage and dp size (--to-tp-size): the same .pt files as
    DeepSpeed's, equal object for object."""
    import torch
    ckpt = os.path.join(FIX, case, "ckpt")
    fails = []
    try:
        subprocess.run([ZCKPT, "reshard", "-q", ckpt, ident, "--to-tp-size", str(exp["tp_size"]), "--to-stage",
                        str(exp["stage"]), "--to-world-size", str(exp["dp_size"])], check=True)
        src_tag = os.path.join(ckpt, "global_step2")
        names = sorted(f for f in os.listdir(src_tag) if f.endswith(".pt"))
        ours = sorted(f for f in os.listdir(os.path.join(ident, "global_step2")) if f.endswith(".pt"))
        if names != ours:
            fails.append(f"{case}: AutoTP reshard files {ours} vs DeepSpeed's {names}")
        for f in names:
            if f in ours and not same_obj(torch.load(os.path.join(src_tag, f), weights_only=False),
                                          torch.load(os.path.join(ident, "global_step2", f), weights_only=False)):
                fails.append(f"{case}: AutoTP reshard to the source's own layout: {f} differs from DeepSpeed's")
    except Exception as e:  # noqa: BLE001
        fails.append(f"{case} {what}: {e}")
    return fails


def check_universal(case, tmp, exp, fails):
    import torch
    ckpt = os.path.join(FIX, case, "ckpt")
    # DeepSpeed's load_universal reads <load dir>/latest_universal, then <load dir>/<tag>
    root = os.path.join(tmp, case + "-zckpt-universal")
    os.makedirs(root)
    with open(os.path.join(root, "latest_universal"), "w") as f:
        f.write("global_step2_universal")
    # ds_to_universal's output in a folder of its own (it writes latest_universal beside it; a reshard carries over
    # the other files of that folder)
    ours, theirs = os.path.join(root, "global_step2_universal"), os.path.join(tmp, case + "-ds", "global_step2_universal")
    subprocess.run([ZCKPT, "to-universal", "-q", ckpt, ours], check=True)
    r = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                        os.path.join(ckpt, "global_step2"), "--output_folder", theirs, "--num_extract_workers", "1",
                        "--num_merge_workers", "1"], capture_output=True, text=True)
    if r.returncode:
        fails.append(f"{case}: ds_to_universal failed: {r.stderr[-500:]}")
        return root
    files = lambda d: sorted(os.path.relpath(os.path.join(dp, f), d) for dp, _, fs in os.walk(d) for f in fs
                             if f != "zckpt-manifest.json")
    if files(ours) != files(theirs):
        fails.append(f"{case}: universal files differ: {sorted(set(files(ours)) ^ set(files(theirs)))}")
    fp32 = load_st(os.path.join(FIX, case, "expected_fp32.safetensors"))
    for rel in files(theirs):
        a = torch.load(os.path.join(ours, rel), weights_only=False)
        b = torch.load(os.path.join(theirs, rel), weights_only=False)
        if rel == "zero/lm_head.weight/fp32.pt" and exp["tied"]:
            # ds_to_universal: TP rank 0's 16-bit half; zckpt: the whole tied matrix (the embedding's master)
            whole = fp32["model.embed_tokens.weight"]
            if not (list(a) == ["param"] and bits_equal(a["param"], whole)):
                fails.append(f"{case}: {rel}: not the whole tied matrix")
            if tuple(b["param"].shape) != (whole.shape[0] // exp["tp_size"], whole.shape[1]):
                fails.append(f"{case}: {rel}: ds_to_universal no longer writes half the matrix: {b['param'].shape}")
            continue
        if not same_obj(a, b):
            fails.append(f"{case}: {rel} differs from ds_to_universal's")
    # zckpt's universal reader takes both folders back: their reshards to plain ZeRO equal the direct reshard of the
    # AutoTP checkpoint, file for file
    direct = os.path.join(tmp, case + "-direct-s2w3")
    subprocess.run([ZCKPT, "reshard", "-q", ckpt, direct, "--to-stage", "2", "--to-world-size", "3"], check=True)
    tp_args = ["--to-tp-size", str(exp["tp_size"])]
    direct_tp = os.path.join(tmp, case + "-direct-tp-s2w3")
    subprocess.run([ZCKPT, "reshard", "-q", ckpt, direct_tp, "--to-stage", "2", "--to-world-size", "3"] + tp_args,
                   check=True)
    for who, src in (("zckpt", root), ("ds_to_universal", os.path.dirname(theirs))):
        for extra, ref in (([], direct), (tp_args, direct_tp)):  # plain ZeRO; AutoTP files at the same TP size
            out = os.path.join(tmp, f"{case}-{who}-universal-s2w3{'-tp' if extra else ''}")
            r = subprocess.run([ZCKPT, "reshard", "-q", src, out, "--to-stage", "2", "--to-world-size", "3"] + extra,
                               capture_output=True, text=True)
            if r.returncode:
                fails.append(f"{case}: zckpt reshard {' '.join(extra)} of {who}'s universal folder failed: "
                             f"{r.stderr.strip()}")
            elif files(out) != files(ref) or any(open(os.path.join(out, f), "rb").read() !=
                                                 open(os.path.join(ref, f), "rb").read() for f in files(ref)):
                fails.append(f"{case}: zckpt reshard {' '.join(extra)} of {who}'s universal folder differs from the "
                             "direct reshard")
    return root


def check_case(case, tmp):
    fails = []
    with open(os.path.join(FIX, case, "expected.json")) as f:
        exp = json.load(f)
    fp32 = load_st(os.path.join(FIX, case, "expected_fp32.safetensors"))
    state = load_st(os.path.join(FIX, case, "expected_state.safetensors"))
    ref_loss = exp["loss_step3"]
    base = {"tied": exp["tied"], "stage": exp["stage"], "dtype": exp["dtype"]}

    def compare(tag, res, with_state):
        for n, t in fp32.items():
            if n not in res["fp32"] or not bits_equal(res["fp32"][n].cpu(), t):
                fails.append(f"{case} {tag}: fp32 master of {n} differs from the source engine's")
        if with_state:
            for n, t in state.items():
                if n not in res["state"] or not bits_equal(res["state"][n].cpu(), t):
                    fails.append(f"{case} {tag}: {n} differs from the source engine's")
        if res.get("uci_same") is False:
            fails.append(f"{case} {tag}: the universal_checkpoint_info loaded differs from the one the engine builds")
        loss = res["losses"][0]
        tol = LOSS_RTOL[exp["dtype"]]
        if not abs(loss - ref_loss) <= tol * abs(ref_loss):
            fails.append(f"{case} {tag}: next loss {loss!r} vs the source engine's {ref_loss!r} (rtol {tol})")
        return loss

    uni = check_universal(case, tmp, exp, fails)
    # AutoTP engine, same TP size, dp 1 (from dp 2 in the tp2dp2 case), from zckpt's universal folder
    for dp in (1,):
        tag = f"universal->tp{exp['tp_size']}xdp{dp}"
        try:
            res = run_load(tmp, f"{case}-{tag}", dict(base, world=exp["tp_size"] * dp, tp=exp["tp_size"],
                                                       universal=True, load=uni))
            loss = compare(tag, res, True)
            print(f"  {case} {tag}: loss {loss:.9g} (source {ref_loss:.9g})")
        except Exception as e:  # noqa: BLE001
            fails.append(f"{case} {tag}: {e}")
    # plain ZeRO (TP 1) from zckpt reshard --to-tp-size 1, at the source's dp size
    tp1_out = None
    for stage in ({1: 3, 2: 2, 3: 2}[exp["stage"]],):  # one target stage per case: 1 -> 3, 2 -> 2, 3 -> 2
        tag = f"reshard->tp1-s{stage}w{exp['dp_size']}"
        out = tp1_out = os.path.join(tmp, f"{case}-{tag}")
        try:
            subprocess.run([ZCKPT, "reshard", "-q", os.path.join(FIX, case, "ckpt"), out, "--to-stage", str(stage),
                            "--to-world-size", str(exp["dp_size"]), "--to-tp-size", "1"], check=True)
            res = run_load(tmp, f"{case}-{tag}", dict(base, stage=stage, world=exp["dp_size"], tp=1, universal=False,
                                                       load=out))
            loss = compare(tag, res, True)
            print(f"  {case} {tag}: loss {loss:.9g} (source {ref_loss:.9g})")
        except Exception as e:  # noqa: BLE001
            fails.append(f"{case} {tag}: {e}")
    # AutoTP files again (`--to-tp-size` = the source's TP size): resharded to the source's own stage and dp size they
    # equal DeepSpeed's files object for object; at another stage and dp size, DeepSpeed's AutoTP engine at (TP, new DP)
    # loads them with a plain load_checkpoint (DeepSpeed refuses another DP size of its own files)
    tp, stage, dp = exp["tp_size"], exp["stage"], exp["dp_size"]
    fails += identity_problems(case, os.path.join(tmp, f"{case}-tp{tp}-identity"), exp, "tp identity")
    # ... and from the TP 1 files above back to TP size tp (DeepSpeed's split by the model's config.json): the same
    # bytes as the direct reshard, loaded once for both
    stage2, dp2 = {1: 2, 2: 3, 3: 1}[stage], 2 if dp == 1 else 1
    tag = f"reshard->tp1->tp{tp}-s{stage2}w{dp2}"
    direct, out = os.path.join(tmp, f"{case}-reshard->tp{tp}-s{stage2}w{dp2}"), os.path.join(tmp, f"{case}-{tag}")
    try:
        subprocess.run([ZCKPT, "reshard", "-q", os.path.join(FIX, case, "ckpt"), direct, "--to-tp-size", str(tp),
                        "--to-stage", str(stage2), "--to-world-size", str(dp2)], check=True)
        subprocess.run([ZCKPT, "reshard", "-q", tp1_out, out, "--to-tp-size", str(tp), "--to-stage", str(stage2),
                        "--to-world-size", str(dp2), "--model-config", os.path.join(FIX, case, "config.json")],
                       check=True)
        files = lambda d: sorted(os.path.relpath(os.path.join(p, f), d) for p, _, fs in os.walk(d) for f in fs)
        if files(out) != files(direct) or any(open(os.path.join(out, f), "rb").read() !=
                                              open(os.path.join(direct, f), "rb").read() for f in files(direct)):
            fails.append(f"{case} {tag}: differs from the direct reshard at TP {tp}")
        if dp == 1:  # a DP 1 source's load would run on tp * dp2 = 4 ranks: check_map's TP 4 load (qwen2) takes them
            return fails
        res = run_load(tmp, f"{case}-{tag}", dict(base, stage=stage2, world=tp * dp2, tp=tp, universal=False, load=out))
        loss = compare(tag, res, True)
        print(f"  {case} {tag}: loss {loss:.9g} (source {ref_loss:.9g})")
    except Exception as e:  # noqa: BLE001
        fails.append(f"{case} {tag}: {e}")
    return fails


def check_tp4(case, tmp, stage2, base, fp32, state, ref_loss=None, grain=None):
    fails = []
    # TP 2 -> 4 by the source's affine map and the model's own config.json: its 2 kv heads leave TP ranks 2 and 3 empty
    # attention shards, which DeepSpeed keeps out of the optimizer and saves as frozen zero-element params there (and
    # with tp_grain_size 8 the MLP's 3 grains leave rank 3 none).
    # DeepSpeed's AutoTP engine at TP 4 x DP 1 loads the files: masters and Adam state bit for bit, the
    # universal_checkpoint_info is the one it builds at TP 4, and the next loss is the source engine's (to LOSS_RTOL)
    tag = f"reshard->tp4-s{stage2}w1"
    out, cfg = os.path.join(tmp, f"{case}-{tag}"), os.path.join(FIX, case, "config.json")
    try:
        subprocess.run([ZCKPT, "reshard", "-q", os.path.join(FIX, case, "ckpt"), out, "--to-tp-size", "4",
                        "--to-stage", str(stage2), "--to-world-size", "1", "--model-config", cfg], check=True)
        res = run_load(tmp, f"{case}-{tag}", dict(base, stage=stage2, world=4, tp=4, universal=False, load=out,
                                                   case=case, grain=grain))
        if res.get("uci_same") is not True:
            fails.append(f"{case} {tag}: the universal_checkpoint_info loaded differs from the one the engine builds")
        for n, t in fp32.items():
            if n not in res["fp32"] or not bits_equal(res["fp32"][n].cpu(), t):
                fails.append(f"{case} {tag}: fp32 master of {n} differs from the source engine's")
        for n, t in state.items():
            if n not in res["state"] or not bits_equal(res["state"][n].cpu(), t):
                fails.append(f"{case} {tag}: {n} differs from the source engine's")
        loss, tol = res["losses"][0], LOSS_RTOL[base["dtype"]]
        if ref_loss is not None and not abs(loss - ref_loss) <= tol * abs(ref_loss):
            fails.append(f"{case} {tag}: next loss {loss!r} vs the source engine's {ref_loss!r} (rtol {tol})")
        print(f"  {case} {tag}: state equal, universal_checkpoint_info DeepSpeed's, loss {loss:.9g}")
    except Exception as e:  # noqa: BLE001
        fails.append(f"{case} {tag}: {e}")
    return fails


def check_map(case, tmp):
    """Other layouts of DeepSpeed's own (tp4_s2_bf16_tied_kv2: TP 4 with 2 kv heads, ranks 2 and 3 holding empty
    attention shards, saved as frozen there; mistral; qwen2 with tp_grain_size 8): zckpt's AutoTP files at the source's
    own layout equal DeepSpeed's object for object (the reader and the writer of each); the qwen2 case at TP 4 (kv heads
    and grains leave ranks empty: rank 3 gets no MLP rows) is loaded by DeepSpeed's engine there, with its own
    universal_checkpoint_info; the kv2 case's universal folder (ds_to_universal fails on it) by load_universal."""
    fails = []
    with open(os.path.join(FIX, case, "expected.json")) as f:
        exp = json.load(f)
    ckpt = os.path.join(FIX, case, "ckpt")
    tp, stage, dp = exp["tp_size"], exp["stage"], exp["dp_size"]
    probs = identity_problems(case, os.path.join(tmp, f"{case}-identity"), exp)
    if not probs:
        print(f"  {case}: AutoTP files at the source's layout = DeepSpeed's")
    fails += probs
    if "kv2" in case:
        # the universal folder: ds_to_universal fails on the empty shards (TypeError in _merge_zero_shards); zckpt's
        # (full tensors) is loaded by DeepSpeed's engine at TP 4 with load_universal: state bit for bit, same next loss
        tag = f"universal->tp{tp}xdp1"
        root = os.path.join(tmp, case + "-zckpt-universal")
        try:
            os.makedirs(root)
            with open(os.path.join(root, "latest_universal"), "w") as f:
                f.write("global_step2_universal")
            subprocess.run([ZCKPT, "to-universal", "-q", ckpt, os.path.join(root, "global_step2_universal")],
                           check=True)
            r = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                                os.path.join(ckpt, "global_step2"), "--output_folder", os.path.join(tmp, case + "-dsu"),
                                "--num_extract_workers", "1", "--num_merge_workers", "1"], capture_output=True, text=True)
            if r.returncode == 0:
                fails.append(f"{case}: ds_to_universal no longer fails on empty shards: compare zckpt's folder with it")
            res = run_load(tmp, f"{case}-{tag}", dict(tied=exp["tied"], stage=stage, dtype=exp["dtype"], world=tp, tp=tp,
                                                       universal=True, load=root, case=case))
            fp32 = load_st(os.path.join(FIX, case, "expected_fp32.safetensors"))
            state = load_st(os.path.join(FIX, case, "expected_state.safetensors"))
            for want, got, what in ((fp32, res["fp32"], "fp32 master"), (state, res["state"], "Adam state")):
                for n, v in want.items():
                    if n not in got or not bits_equal(got[n].cpu(), v):
                        fails.append(f"{case} {tag}: {what} {n} differs from the source engine's")
            loss, tol = res["losses"][0], LOSS_RTOL[exp["dtype"]]
            if not abs(loss - exp["loss_step3"]) <= tol * abs(exp["loss_step3"]):
                fails.append(f"{case} {tag}: next loss {loss!r} vs the source engine's {exp['loss_step3']!r}")
            print(f"  {case} {tag}: state equal, loss {loss:.9g} (source {exp['loss_step3']:.9g})")
        except Exception as e:  # noqa: BLE001
            fails.append(f"{case} {tag}: {e}")
    if "grain" in case:
        base = {"tied": exp["tied"], "dtype": exp["dtype"]}
        fails += check_tp4(case, tmp, stage, base, load_st(os.path.join(FIX, case, "expected_fp32.safetensors")),
                           load_st(os.path.join(FIX, case, "expected_state.safetensors")), exp["loss_step3"],
                           grain=exp["ds_config"]["tensor_parallel"]["tp"]["tp_grain_size"])
    return fails


def check_frozen(case, tmp):
    """A case with frozen params (tests/fixtures/autotp/*_frozen): zckpt's AutoTP files at the source's own layout equal
    DeepSpeed's object for object; DeepSpeed's AutoTP engine loads zckpt's reshard into ZeRO-3 AutoTP files (frozen
    params in frozen_param_fragments per dp rank): masters and Adam state bit for bit,
    the frozen params equal the source engine's (expected_frozen: its slices merged by ParamAffineMap.rebuild), next
    loss as above. ds_to_universal refuses the checkpoint (its tp-slice merge finds no fragments for the frozen params'
    patterns); zckpt to-universal writes them whole (test_autotp checks the files)."""
    fails = []
    with open(os.path.join(FIX, case, "expected.json")) as f:
        exp = json.load(f)
    ckpt = os.path.join(FIX, case, "ckpt")
    fp32 = load_st(os.path.join(FIX, case, "expected_fp32.safetensors"))
    state = load_st(os.path.join(FIX, case, "expected_state.safetensors"))
    frozen = load_st(os.path.join(FIX, case, "expected_frozen.safetensors"))
    tp, stage, dp, ref_loss = exp["tp_size"], exp["stage"], exp["dp_size"], exp["loss_step3"]
    base = {"tied": exp["tied"], "dtype": exp["dtype"], "frozen": True, "universal": False}
    fails += identity_problems(case, os.path.join(tmp, f"{case}-identity"), exp)
    r = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                        os.path.join(ckpt, "global_step2"), "--output_folder", os.path.join(tmp, case + "-dsu"),
                        "--num_extract_workers", "1", "--num_merge_workers", "1"], capture_output=True, text=True)
    if r.returncode == 0 or "Unused patterns" not in r.stderr:
        fails.append(f"{case}: ds_to_universal no longer refuses frozen AutoTP params (rc {r.returncode}): zckpt's "
                     "to-universal should be compared with it")
    # (TP 1 files hold the merged frozen params: test_autotp checks them against the live engine's; not loaded here)
    for tag, t, st in ((f"reshard->tp{tp}-s3w1", tp, 3),):
        out = os.path.join(tmp, f"{case}-{tag}")
        try:
            subprocess.run([ZCKPT, "reshard", "-q", ckpt, out, "--to-tp-size", str(t), "--to-stage", str(st),
                            "--to-world-size", "1"], check=True)
            res = run_load(tmp, f"{case}-{tag}", dict(base, stage=st, world=max(t, 1), tp=t, load=out))
            for want, got, what in ((fp32, res["fp32"], "fp32 master"), (state, res["state"], "Adam state"),
                                    (frozen, res["frozen"], "frozen param")):
                for n, v in want.items():
                    if n not in got or not bits_equal(got[n].cpu(), v):
                        fails.append(f"{case} {tag}: {what} {n} differs from the source engine's")
                if set(got) != set(want):
                    fails.append(f"{case} {tag}: {what}s {sorted(set(got) ^ set(want))} on one side only")
            loss, tol = res["losses"][0], LOSS_RTOL[exp["dtype"]]
            if not abs(loss - ref_loss) <= tol * abs(ref_loss):
                fails.append(f"{case} {tag}: next loss {loss!r} vs the source engine's {ref_loss!r} (rtol {tol})")
            print(f"  {case} {tag}: state and frozen params equal, loss {loss:.9g} (source {ref_loss:.9g})")
        except Exception as e:  # noqa: BLE001
            fails.append(f"{case} {tag}: {e}")
    return fails


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        return 0
    if not os.path.exists(ZCKPT) or not os.path.isdir(FIX):
        print("SKIP: no zckpt binary or no AutoTP fixtures")
        return 77
    cases = sys.argv[1:] or CASES
    passed, failed = 0, 0
    tmp = tempfile.mkdtemp(prefix="zckpt-autotp-")
    try:
        for case in cases:
            try:
                fails = (check_frozen(case, tmp) if case.endswith("_frozen") else
                         check_map(case, tmp) if case in MAP_CASES else check_case(case, tmp))
            except Exception:  # noqa: BLE001
                fails = [f"{case}: {traceback.format_exc()}"]
            for f in fails:
                print("FAIL", f)
            passed += not fails
            failed += bool(fails)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
