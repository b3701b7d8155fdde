#!/usr/bin/env python3
"""make_big_dcp.py: a large torch Distributed Checkpoint for the benches, saved by torch itself.

usage: PY tests/bench/make_big_dcp.py OUT [--params N] [--world W] [--tensors K [--shape RxC]]
                                          [--columns] [--dtype fp32|bf16]

Writes OUT/.metadata and OUT/__<r>_0.distcp as FSDP2 saves a model with
dcp.save({"model": model_state_dict}) at W ranks (gloo on the CPU; the script relaunches
itself under torch.distributed.run): every weight a DTensor sharded by rows over the W
ranks (Shard(0), torch.chunk's split, as fully_shard makes it), so each tensor is W chunks
in W files.

  --params N   (default 1e9) a Llama-shaped model of about N params: hidden size C = 2048,
               MLP 5632, vocab 32000, untied lm_head, L layers chosen to reach N;
  --tensors K  instead: K small tensors of 8 x 64 (the chunk-count bench: K * W chunks);
  --shape RxC  with --tensors: K tensors of R x C instead;
  --columns    shard every weight by columns (Shard(1): tensor parallel's RowwiseParallel,
               as torchtitan saves it), each chunk one run per row.

Each rank holds only its shards (N / W params); the values are fixed random numbers, so
the files do not compress. The saved layout, not the values, is what the benches time.
"""
import argparse
import os
import subprocess
import sys


def shapes(params, tensors, shape=(8, 64)):
    if tensors:
        return [(f"model.blocks.{i}.weight", shape) for i in range(tensors)]
    c, mlp, vocab = 2048, 5632, 32000
    per_layer = 4 * c * c + 3 * c * mlp + 2 * c
    fixed = 2 * vocab * c + c
    layers = max(1, round((params - fixed) / per_layer))
    out = [("model.embed_tokens.weight", (vocab, c))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (c, c)), (p + "self_attn.k_proj.weight", (c, c)),
                (p + "self_attn.v_proj.weight", (c, c)), (p + "self_attn.o_proj.weight", (c, c)),
                (p + "mlp.gate_proj.weight", (mlp, c)), (p + "mlp.up_proj.weight", (mlp, c)),
                (p + "mlp.down_proj.weight", (c, mlp)), (p + "input_layernorm.weight", (c,)),
                (p + "post_attention_layernorm.weight", (c,))]
    out += [("model.norm.weight", (c,)), ("lm_head.weight", (vocab, c))]
    return out


def rank_main(a):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    sd = {}
    total = 0
    shape0 = tuple(int(x) for x in a.shape.split("x")) if a.shape else (8, 64)
    for i, (name, shape) in enumerate(shapes(a.params, a.tensors, shape0)):
        dim = 1 if a.columns and len(shape) > 1 else 0
        n = shape[dim]
        per = -(-n // world)   # torch.chunk: ceil(n / W) per rank, the last ones short
        lo, hi = min(rank * per, n), min((rank + 1) * per, n)
        # the values of the whole tensor (the same whatever the split), this rank's slice
        g = torch.Generator().manual_seed(i * 1009)
        full = torch.rand(shape, generator=g).to(dtype) if a.tensors and (a.shape or a.columns) else None
        if full is not None:
            local = full.narrow(dim, lo, hi - lo).contiguous()
        else:
            g = torch.Generator().manual_seed(i * 1009 + rank)
            local = torch.rand((hi - lo,) + tuple(shape[1:]), generator=g).to(dtype)
        stride = tuple(int(torch.tensor(shape[d + 1:]).prod()) for d in range(len(shape)))
        sd[name] = DTensor.from_local(local, mesh, [Shard(dim)], run_check=False, shape=torch.Size(shape), stride=stride)
        total += int(torch.tensor(shape).prod())
    if rank == 0:
        print(f"make_big_dcp: {len(sd)} tensors, {total} params, {a.dtype}, {world} ranks -> {a.out}", file=sys.stderr)
    dcp.save({"model": sd}, checkpoint_id=a.out)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--params", type=float, default=1e9)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--tensors", type=int, default=0)
    ap.add_argument("--shape", default="")
    ap.add_argument("--columns", action="store_true")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    a = ap.parse_args()
    if "LOCAL_RANK" in os.environ:
        return rank_main(a)
    os.makedirs(a.out, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.world}",
           os.path.abspath(__file__)] + sys.argv[1:]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    sys.exit(subprocess.call(cmd, env=env))


if __name__ == "__main__":
    main()
