"""interop_reshard_universal.py: `zckpt reshard` of a universal folder written by DeepSpeed's own ds_to_universal.py
equals, file for file, `zckpt reshard` of the DeepSpeed checkpoint it was made from.

For every committed DeepSpeed fixture (tests/fixtures/deepspeed, DeepSpeed 0.19.8: stages 1-3, W 1-4, bf16 / fp16 /
fp32, 3 param groups, sub-groups, parameter alignment, a zero-element param), run
`python -m deepspeed.checkpoint.ds_to_universal --inject_missing_state` on it, then reshard both the universal
folder (through its parent's latest_universal) and the checkpoint to stages 1, 2, 3 at world sizes 1-4: the tag
folders (every optimizer and model file, the zckpt manifest) and `latest` must be byte for byte identical.

`zckpt consolidate` of the same ds_to_universal folder equals, byte for byte, `zckpt consolidate` of the checkpoint,
and each of its tensors is DeepSpeed's zero_to_fp32 output of the checkpoint (get_fp32_state_dict_from_zero_checkpoint,
run here; tied aliases are the output's metadata).

Known DeepSpeed behaviours, checked as such rather than skipped:
  s2w2_fp32_roundrobin     ds_to_universal follows param_slice_mappings, whose offsets ignore
                           round_robin_gradients: the reordered params get each other's values. Their fp32.pt are
                           then not the masters of the module's 16-bit copies, and zckpt's reshard and consolidate
                           of that folder refuse it, naming one of them.
  s1w2_bf16_bf16optimizer  zero_to_fp32 refuses the BF16_Optimizer checkpoint; the reshards of the checkpoint and
                           of ds_to_universal's folder must both hold the live engine's fp32 masters
                           (expected.json live_fp32_params), read back by DeepSpeed's zero_to_fp32.

Prints `N passed, M failed`; exit 0 only if all pass (77 without a zckpt binary).
"""
import functools
import hashlib
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ds_harness as H  # noqa: E402

FIX = H.FIXTURES
zck = H.zckpt
# the params round_robin_gradients reorders in s2w2_fp32_roundrobin (ds_to_universal gives them each other's values)
ROUND_ROBIN_MOVED = ("fc1.weight", "fc2.weight", "fc1.bias", "ln.weight", "ln.bias", "fc2.bias")
TARGETS = [(s, w) for s in (1, 2, 3) for w in (1, 2, 3, 4)]


def tree(d):
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = fh.read()
    return out


def diff_trees(a, b):
    ta, tb = tree(a), tree(b)
    if ta.keys() != tb.keys():
        return [f"files {sorted(ta.keys() ^ tb.keys())} in one output only"]
    return [f"{k} differs" for k in sorted(ta) if ta[k] != tb[k]]


def fp32_of(ckpt):
    """name -> fp32 master through DeepSpeed's zero_to_fp32 (reads what zckpt wrote)."""
    import contextlib
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        return get_fp32_state_dict_from_zero_checkpoint(ckpt)


def consolidate_check(case, src, uc_root, tmp, z2f=True):
    """consolidate(ds_to_universal(src)) == consolidate(src), and == zero_to_fp32(src) tensor for tensor; the
    names of the tensors that differ (ds_to_universal's round-robin misplacement) or problems."""
    a, b = os.path.join(tmp, "c-ckpt.safetensors"), os.path.join(tmp, "c-uc.safetensors")
    e = zck("consolidate", "-q", src, a) or zck("consolidate", "-q", uc_root, b)
    if e:
        return [f"consolidate failed: {e}"], []
    from safetensors.torch import load_file
    ours, ref = load_file(b), load_file(a)
    wrong = sorted(n for n in ref if n not in ours or not H.same(ref[n], ours[n]))
    if not wrong and open(a, "rb").read() != open(b, "rb").read():
        return ["consolidate of ds_to_universal's folder: same tensors, other bytes"], []
    if z2f and not wrong:
        sd = fp32_of(src)
        for n, t in ours.items():
            if n not in sd or not H.same(sd[n].detach().contiguous(), t):
                return [f"consolidate of ds_to_universal's folder: {n} is not zero_to_fp32's"], []
        missing = sorted(set(sd) - set(ours))
        from safetensors import safe_open
        with safe_open(b, "pt") as f:  # dropped tied aliases are in the metadata
            tied = json.loads((f.metadata() or {}).get("tied_parameters", "{}"))
        if any(n not in tied for n in missing):
            return [f"consolidate of ds_to_universal's folder lacks {missing}"], []
    return [], wrong


def check_case(case, tmp):
    src = os.path.join(FIX, "deepspeed", case, "ckpt")
    uc_root = os.path.join(tmp, "uc")
    os.makedirs(uc_root)
    err = H.ds_to_universal(os.path.join(src, "global_step2"), os.path.join(uc_root, "global_step2_universal"),
                            os.path.join(tmp, "uc.log"))
    probs, notes = [], []
    if case.startswith("s0") or case.endswith("_nvme"):
        # ZeRO-0: ds_to_universal refuses it; NVMe offload: it cannot read offloaded_tensors/ (the optim files hold
        # empty partitions). zckpt's reshards into every ZeRO stage hold the live engine's fp32 masters, as
        # DeepSpeed's zero_to_fp32 reads them back
        if not err and case.startswith("s0"):
            probs.append("ds_to_universal converted a ZeRO-0 checkpoint (it used to refuse)")
        with open(os.path.join(FIX, "deepspeed", case, "expected.json")) as f:
            live = json.load(f)["live_fp32_params"]
        for s, w in TARGETS:
            out = os.path.join(tmp, f"z0-{s}-{w}")
            # an NVMe source's ZeRO-3 targets keep its offload by default: their masters are then in
            # offloaded_tensors/, which zero_to_fp32 cannot read (as for DeepSpeed's own NVMe saves); the
            # masters are checked in rank files here, and the default's through zckpt consolidate below
            plain = ["--to-offload", "none"] if case.endswith("_nvme") else []
            e = zck("reshard", "-q", "--to-stage", str(s), "--to-world-size", str(w), *plain, src, out)
            if e:
                probs.append(f"stage {s} W {w}: reshard failed: {e}")
                continue
            got = fp32_of(out)
            for n, h in live.items():
                if hashlib.sha256(got[n].detach().contiguous().numpy().tobytes()).hexdigest() != h["sha256"]:
                    probs.append(f"stage {s} W {w}: {n}: fp32 master differs from the live engine's")
            shutil.rmtree(out, ignore_errors=True)
            if case.endswith("_nvme") and s == 3:
                e = zck("reshard", "-q", "--to-stage", "3", "--to-world-size", str(w), src, out)
                st = os.path.join(tmp, "nvme.safetensors")
                if e and "give --swap-min-bytes" in e:
                    continue   # a partition size the source's swaps do not settle: refused, not guessed (test_nvme)
                e = e or zck("consolidate", "-q", out, st)
                if e:
                    probs.append(f"stage 3 W {w}, NVMe kept: {e}")
                    continue
                from safetensors.torch import load_file
                got = load_file(st)
                for n, h in live.items():
                    if hashlib.sha256(got[n].contiguous().numpy().tobytes()).hexdigest() != h["sha256"]:
                        probs.append(f"stage 3 W {w}, NVMe kept: {n}: fp32 master differs from the live engine's")
                shutil.rmtree(out, ignore_errors=True)
                os.remove(st)
        notes.append(("ZeRO-0: ds_to_universal refuses it" if case.startswith("s0") else
                      "NVMe offload: ds_to_universal " + ("fails" if err else "cannot read offloaded_tensors/")) +
                     "; the reshards hold the live fp32 masters")
        return probs, notes
    if err:
        return [f"ds_to_universal failed: {err}"], []
    if case.endswith("bf16optimizer"):
        with open(os.path.join(FIX, "deepspeed", case, "expected.json")) as f:
            live = json.load(f)["live_fp32_params"]
        for what, frm in (("the checkpoint", src), ("ds_to_universal's folder", uc_root)):
            out = os.path.join(tmp, "from_" + ("ckpt" if frm == src else "uc"))
            err = zck("reshard", "-q", "--to-stage", "2", "--to-world-size", "3", frm, out)
            if err:
                probs.append(f"reshard of {what} failed: {err}")
                continue
            got = fp32_of(out)
            for n, h in live.items():
                t = got[n].detach().contiguous()
                if hashlib.sha256(t.numpy().tobytes()).hexdigest() != h["sha256"]:
                    probs.append(f"reshard of {what}: {n}: fp32 master differs from the live engine's")
        notes.append("BF16_Optimizer: the reshards of the checkpoint and of ds_to_universal's folder hold the live "
                     "fp32 masters")
        p, wrong = consolidate_check(case, src, uc_root, tmp, z2f=False)   # zero_to_fp32 refuses these files
        probs += p + [f"consolidate: {n} differs" for n in wrong]
        if not p and not wrong:
            notes.append("consolidate of ds_to_universal's folder = consolidate of the checkpoint")
        return probs, notes
    if case.endswith("roundrobin"):
        probs = []
        for job in (("reshard", "-q", "--to-stage", "2", "--to-world-size", "1", uc_root, os.path.join(tmp, "rs")),
                    ("consolidate", "-q", uc_root, os.path.join(tmp, "rr.safetensors"))):
            e = zck(*job)
            if not e or "is not the fp32 master" not in e or "\n" in e or not any(
                    f"zero/{n}/fp32.pt" in e for n in ROUND_ROBIN_MOVED):
                probs.append(f"{job[0]} of ds_to_universal's round-robin folder: expected a one-line refusal naming a "
                             f"misplaced param's fp32.pt, got {e!r}")
            if os.path.exists(job[-1]):
                probs.append(f"{job[0]}: output left behind")
        return probs, ["round-robin: ds_to_universal misplaces the reordered params (DeepSpeed bug); its folder is "
                       "refused"] if not probs else []
    for s, w in TARGETS:
        a, b = os.path.join(tmp, f"ds-{s}-{w}"), os.path.join(tmp, f"uc-{s}-{w}")
        e1 = zck("reshard", "-q", "--to-stage", str(s), "--to-world-size", str(w), src, a)
        e2 = zck("reshard", "-q", "--to-stage", str(s), "--to-world-size", str(w), uc_root, b)
        if e1 or e2:
            probs.append(f"stage {s} W {w}: reshard failed: {e1 or ''} {e2 or ''}")
            continue
        # the tag folder and `latest` (the fixture's root also holds DeepSpeed's copied zero_to_fp32.py, a
        # side file carried over from the checkpoint's root only)
        d = diff_trees(os.path.join(a, "global_step2"), os.path.join(b, "global_step2"))
        if open(os.path.join(a, "latest")).read() != open(os.path.join(b, "latest")).read():
            d.append("latest differs")
        probs += [f"stage {s} W {w}: {x}" for x in d]
        shutil.rmtree(a, ignore_errors=True)
        shutil.rmtree(b, ignore_errors=True)
    p, wrong = consolidate_check(case, src, uc_root, tmp)
    probs += p + [f"consolidate: {n} differs" for n in wrong]
    if not p and not wrong:
        notes.append("consolidate of ds_to_universal's folder = consolidate of the checkpoint = zero_to_fp32")
    if not probs:
        notes.append(f"{len(TARGETS)} targets: byte-identical to the reshard of the checkpoint")
    return probs, notes


def main():
    if not os.path.exists(H.ZCKPT):
        print(f"SKIP: no zckpt binary at {H.ZCKPT} (set ZCK_BIN)")
        return 77
    cases = [(case, functools.partial(check_case, case)) for case, _ in H.fixture_checkpoints()
             if not sys.argv[1:] or case in sys.argv[1:]]
    return H.run_cases(cases, "zck_interop_rsu_", shown=20)


if __name__ == "__main__":
    sys.exit(main())
