"""interop_accelerate.py: zckpt on what Accelerate's save_state writes with DeepSpeed (CPU, torchrun, gloo).

Accelerate names its DeepSpeed tag `pytorch_model` (no global_stepN) and keeps random_states_<r>.pkl beside
`latest`. A tiny GPT-2 (interop_hf_trainer.build_model: fp32, dropout 0, tied lm_head) trains with Accelerator +
DeepSpeedPlugin (AdamW, torch_adam) on a fixed global batch of 6 sequences per step (W x per-device batch).

1. W=2 ZeRO-3: 2 steps, save_state(ckpt), 2 more steps (the uninterrupted losses).
2. zckpt consolidate ckpt: equals DeepSpeed's zero_to_fp32 of it bit for bit (the tied lm_head as an alias).
3. zckpt reshard ckpt --to-world-size 1 --to-stage 2: Accelerate's files beside `latest` are carried over
   byte for byte; Accelerate's load_state (W=1, ZeRO-2) of it holds exactly the state that load_state of the
   original (W=2, ZeRO-3) holds: every param's full fp32 master, exp_avg and exp_avg_sq bit for bit (DeepSpeed's
   safe_get_full_* API), the same global_steps and optimizer step. The original's resume continues the
   uninterrupted losses bit for bit. The resharded resume's first loss depends on the weights only: within
   1e-6 relative (a forward of 6 sequences instead of 2 x 3). The next one also depends on the Adam moments,
   reduced over another world size: within 1e-4 (measured 3e-5: Adam's m/sqrt(v) turns the last bits of an
   almost-zero gradient into a whole step), while the state it starts from is checked exactly above.
Exit 0 when everything holds, 1 otherwise, 77 without the packages.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import ds_harness as H  # noqa: E402
import interop_hf_trainer as hft  # noqa: E402  (build_model, torchrun (ds_launch's), same_bits)

GLOBAL_BATCH = 6


def worker(mode, stage, ckpt, result_path):
    import torch
    import accelerate.state
    from accelerate import Accelerator, DeepSpeedPlugin
    from accelerate.utils import DistributedType, DummyOptim

    # accelerate finds no backend on a host without CUDA and records one process:
    # gloo over torchrun's processes instead
    orig = accelerate.state.PartialState._prepare_backend

    def prepare_backend(self, *a, **k):
        r = orig(self, *a, **k)
        if r[0] is None and os.environ.get("LOCAL_RANK") is not None:
            return ("gloo", DistributedType.MULTI_CPU)
        return r

    accelerate.state.PartialState._prepare_backend = prepare_backend
    world = int(os.environ["WORLD_SIZE"])
    plugin = DeepSpeedPlugin(hf_ds_config={
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world, "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01, "torch_adam": True}},
        "steps_per_print": 10**6})
    acc = Accelerator(deepspeed_plugin=plugin)
    model = hft.build_model()
    model, opt = acc.prepare(model, DummyOptim(model.parameters()))

    def step(k):
        g = torch.Generator().manual_seed(100 + k)
        ids = torch.randint(0, hft.VOCAB, (GLOBAL_BATCH, hft.SEQ), generator=g)
        per = GLOBAL_BATCH // world
        ids = ids[acc.process_index * per:(acc.process_index + 1) * per]
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        return float(acc.reduce(loss.detach(), "mean"))

    result = {"world": acc.num_processes}
    if mode == "save":
        result["losses"] = [step(0), step(1)]
        acc.save_state(ckpt)
        result["losses"] += [step(2), step(3)]
    else:
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
        acc.load_state(ckpt)
        # stage 1/2: the optimizer-state fragments are linked only at the next step; link them now (views only,
        # as ds_harness.snapshot does)
        inner = model.optimizer
        if hasattr(inner, "_lazy_init_hp_params_optimizer_state") and inner.optimizer.state:
            inner._hp_optimizer_states_linked = False
            inner._lazy_init_hp_params_optimizer_state()
        state = {}
        for name, p in model.module.named_parameters():  # collective at ZeRO-3: every rank calls it
            state[name] = {"fp32": safe_get_full_fp32_param(p).detach().clone(),
                           "exp_avg": safe_get_full_optimizer_state(p, "exp_avg").detach().clone(),
                           "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq").detach().clone()}
        if acc.is_main_process:
            torch.save(state, result_path + ".state.pt")
        steps = sorted({float(s["step"]) for s in inner.optimizer.state.values() if "step" in s})
        result["global_steps"] = model.global_steps
        result["optimizer_steps"] = steps
        result["losses"] = [step(2), step(3)]
    if acc.is_main_process:
        with open(result_path, "w") as f:
            json.dump(result, f)
    acc.wait_for_everyone()


def run(world, argv, log):
    return hft.torchrun(world, __file__, argv, log)   # this file's ranks


def main():
    zckpt = os.environ["ZCK_BIN"]
    fail = H.Failures()
    import torch

    with H.scratch("interop_accelerate.") as tmp:
        ckpt = os.path.join(tmp, "ckpt")
        if run(2, ["save", "3", ckpt, os.path.join(tmp, "save.json")], os.path.join(tmp, "save.log")):
            fail("W=2 ZeRO-3 Accelerate training failed")
            return 1
        with open(os.path.join(tmp, "save.json")) as f:
            saved = json.load(f)
        if saved["world"] != 2:
            fail(f"Accelerate ran {saved['world']} process(es), not 2")
        with open(os.path.join(ckpt, "latest")) as f:
            if f.read().strip() != "pytorch_model":
                fail("Accelerate's tag is not pytorch_model: the test's premise changed")

        # 2. consolidate == zero_to_fp32
        out = os.path.join(tmp, "model.safetensors")
        r = subprocess.run([zckpt, "consolidate", "-q", ckpt, out], capture_output=True, text=True)
        if r.returncode:
            fail(f"consolidate: {r.returncode}: {r.stderr.strip()}")
        else:
            n = hft.check_zero_to_fp32(ckpt, out, fail)
            print(f"consolidate: {n} tensors checked against zero_to_fp32")

        # 3. reshard to W=1 ZeRO-2, and resume both with Accelerate
        r1 = os.path.join(tmp, "r1")
        r = subprocess.run([zckpt, "reshard", "-q", "--to-world-size", "1", "--to-stage", "2", ckpt, r1],
                           capture_output=True, text=True)
        if r.returncode:
            fail(f"reshard: {r.returncode}: {r.stderr.strip()}")
            return 1
        for name in sorted(os.listdir(ckpt)):
            src = os.path.join(ckpt, name)
            if os.path.isfile(src) and name != "latest":
                dst = os.path.join(r1, name)
                if not os.path.isfile(dst) or open(src, "rb").read() != open(dst, "rb").read():
                    fail(f"reshard: {name} (Accelerate's, beside latest) not carried over as is")
        results = {}
        for key, world, stage, src in (("orig", 2, "3", ckpt), ("resharded", 1, "2", r1)):
            res = os.path.join(tmp, f"load-{key}.json")
            if run(world, ["load", stage, src, res], os.path.join(tmp, f"load-{key}.log")):
                fail(f"Accelerate load_state of the {key} checkpoint (W={world}, ZeRO-{stage}) failed")
                return 1
            with open(res) as f:
                results[key] = json.load(f)
            results[key]["state"] = torch.load(res + ".state.pt")
        a, b = results["orig"], results["resharded"]
        if a["losses"] != saved["losses"][2:]:
            fail(f"the original's resume: losses {a['losses']} vs uninterrupted {saved['losses'][2:]}")
        if a["global_steps"] != b["global_steps"]:
            fail(f"global_steps {b['global_steps']} after the reshard, {a['global_steps']} before")
        for key, res in results.items():
            if res["optimizer_steps"] != [float(a["global_steps"])]:
                fail(f"{key}: the optimizer's step after load_state {res['optimizer_steps']}, expected {a['global_steps']}")
        n = 0
        for name, parts in a["state"].items():
            for part, t in parts.items():
                u = b["state"].get(name, {}).get(part)
                if u is None or not hft.same_bits(t, u):
                    fail(f"after load_state of the reshard: {name} {part} differs from the original's")
                n += 1
        print(f"load_state: {n} full tensors (fp32, exp_avg, exp_avg_sq) bit-equal after the reshard")
        rel = [abs(x - y) / abs(y) for x, y in zip(b["losses"], a["losses"])]
        print(f"losses after resume: original {a['losses']}, resharded {b['losses']}, relative {rel}")
        if rel[0] > 1e-6 or rel[1] > 1e-4:
            fail(f"resharded resume's losses {b['losses']} vs {a['losses']}: relative {rel}")
    return 1 if fail else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("save", "load"):
        worker(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
        hft.end_worker()
    else:
        sys.exit(main())
