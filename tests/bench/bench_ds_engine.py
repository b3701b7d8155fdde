"""bench_ds_engine.py: what DeepSpeed's save_checkpoint costs a training loop with each
checkpoint engine, measured in one launch so the ratios hold under the same load:
  none       the same steps with no save (the floor)
  torch      DeepSpeed's default TorchCheckpointEngine (torch.save, no fsync)
  decoupled  DeepSpeed's DecoupledCheckpointEngine (checkpoint.writer.decoupled: a writer
             process per rank; the commit waits for it at the next optimizer step)
  zckpt      zckpt.ds_engine.install(engine): the torch engine's bytes, each file fsynced,
             the tag folder staged and renamed whole, a manifest (XXH3 per tensor), `latest`
             committed atomically
  zckpt-bg   the same with install(engine, background=True): torch.save into memory, a
             thread copies and fsyncs, the commit at the next optimizer step
Each variant trains STEPS optimizer steps of one model (ZeRO-2, fp32, torch Adam, W ranks on
the CPU over gloo), saving every SAVE_EVERY steps; the saves are not at the last step, so a
decoupled commit lands inside the loop. Stall per save = (loop time - the no-save loop's) /
saves: it counts every wait a save causes, wherever it lands (in save_checkpoint, or in the
next step for the decoupled engine). Also the time inside save_checkpoint itself (median).

Usage (interop venv): DS_ACCELERATOR=cpu python tests/bench/bench_ds_engine.py [W] [WIDTH] [LAYERS]
(not run by ctest; tests/bench/bench_ds_engine.sh appends the result to results-ds-engine.txt)
"""
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS, SAVE_EVERY, WARMUP = 13, 4, 2
VARIANTS = ("none", "torch", "decoupled", "zckpt", "zckpt-bg", "none")  # the floor twice: its drift shows


def worker(out_dir, width, layers):
    import torch
    import deepspeed
    import deepspeed.comm as dist
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import zckpt.ds_engine

    # what DeepSpeed's launcher sets and its decoupled writer reads (one machine)
    os.environ.setdefault("CROSS_SIZE", "1")
    os.environ.setdefault("CROSS_RANK", "0")
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    results = {}
    for i, variant in enumerate(VARIANTS):
        torch.manual_seed(1)
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
        cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
               "zero_optimization": {"stage": 2}, "steps_per_print": 10 ** 9}
        if variant == "decoupled":
            # a data_parallel unit: without one DeepSpeed 0.19.8 fails (UniversalParallelInfo has no dp_rank)
            cfg["checkpoint"] = {"writer": {"decoupled": True, "data_parallel": "machine"}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        if variant.startswith("zckpt"):
            zckpt.ds_engine.install(engine, background=variant == "zckpt-bg")
        save_dir = os.path.join(out_dir, f"{variant}{i}")
        x = torch.randn(4, width)
        calls, t0, error = [], None, None
        try:
            for step in range(1, STEPS + 1):
                if step == WARMUP + 1:
                    dist.barrier()
                    t0 = time.perf_counter()
                loss = engine(x).pow(2).mean()
                engine.backward(loss)
                engine.step()
                if variant != "none" and step > WARMUP and step % SAVE_EVERY == 0:
                    c0 = time.perf_counter()
                    engine.save_checkpoint(save_dir, tag=f"global_step{step}")
                    calls.append(time.perf_counter() - c0)
            if variant in ("decoupled", "zckpt-bg") and engine.checkpoint_engine.get_commit_info() is not None:
                engine._commit_decoupled_checkpoint()
        except RuntimeError as e:  # the same failure on every rank (the decoupled writer's refusal)
            error = str(e).splitlines()[0][:160]
        dist.barrier()
        loop = time.perf_counter() - t0
        if variant == "zckpt-bg":
            engine.checkpoint_engine.cleanup()
        if variant == "decoupled":
            try:
                engine.checkpoint_engine.commit_info = None  # nothing to commit after a failure
                engine.checkpoint_engine.cleanup()
            except Exception:
                pass
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(save_dir) for f in fs) \
            if os.path.isdir(save_dir) else 0
        results[f"{variant}{i}"] = {"loop": loop, "calls": calls, "bytes": size, "error": error}
        del engine
        dist.barrier()
        if rank == 0 and os.path.isdir(save_dir):
            shutil.rmtree(save_dir)
        dist.barrier()
    if rank == 0:
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(results, f)


def main():
    W = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    width = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures", "gen"))
    import ds_launch
    out = tempfile.mkdtemp(prefix="bench_ds_engine.")
    try:
        rc = ds_launch.launch(W, [os.path.abspath(__file__), "--worker", out, str(width), str(layers)],
                              log_prefix=os.path.join(out, "log"))
        if rc != 0:
            for r in range(W):
                with open(os.path.join(out, f"log.rank{r}.log")) as f:
                    sys.stderr.write(f.read()[-3000:])
            sys.exit(f"bench_ds_engine: the ranks failed ({rc})")
        with open(os.path.join(out, "result.json")) as f:
            res = json.load(f)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    floor = min(v["loop"] for k, v in res.items() if k.startswith("none"))
    nsaves = len(next(v["calls"] for k, v in res.items() if k.startswith("torch")))
    params = layers * (width * width + width)
    print(f"ZeRO-2 fp32, {params / 1e6:.1f}M parameters, W={W} ranks (gloo, CPU), {STEPS - WARMUP} timed steps, "
          f"{nsaves} saves")
    print(f"{'engine':<10} {'loop s':>8} {'stall/save s':>13} {'in save_checkpoint s':>21} {'MB/save':>8} "
          f"{'stall / torch':>14} {'in save / torch':>16}")
    torch_stall = torch_call = None
    for k, v in res.items():
        name = k.rstrip("0123456789")
        if v.get("error"):
            print(f"{name:<10} failed in DeepSpeed: {v['error']}")
            continue
        stall = (v["loop"] - floor) / nsaves if name != "none" else 0.0
        med = statistics.median(v["calls"]) if v["calls"] else 0.0
        if name == "torch":
            torch_stall, torch_call = stall, med
        ratio = f"{stall / torch_stall:.2f}x" if torch_stall and name != "none" else "-"
        call_ratio = f"{med / torch_call:.2f}x" if torch_call and name != "none" else "-"
        mb = v["bytes"] / 1e6 / max(nsaves, 1) if v["bytes"] else 0.0
        print(f"{name:<10} {v['loop']:>8.2f} {stall:>13.3f} {med:>21.3f} {mb:>8.1f} {ratio:>14} {call_ratio:>16}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        ds_launch.end_worker()
    else:
        main()
