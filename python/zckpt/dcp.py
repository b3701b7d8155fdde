"""zckpt.dcp: torch Distributed Checkpoint (DCP) helpers shaped like torch's own.

    from zckpt.dcp import dcp_to_torch_save
    dcp_to_torch_save("out/checkpoint-500/pytorch_model_fsdp_0", "full.pt")
    torch.load("full.pt")["model"]

    from zckpt.dcp import consolidate_safetensors_files
    consolidate_safetensors_files("step-100/sharded", "step-100/consolidated")

The DCP folder is read by libzckpt (no torch, no process group, the whole model never in
memory), every chunk's zip CRC-32 is checked as it streams (torch checks none), and the file
appears at its name only once it is complete.
"""
import json
import os
import tempfile

from . import _native as N
from ._run import run

__all__ = ["dcp_to_torch_save", "consolidate_safetensors_files"]


def dcp_to_torch_save(dcp_checkpoint_dir, torch_save_path, *, overwrite=True, progress=None):
    """torch.distributed.checkpoint.format_utils.dcp_to_torch_save(dcp_checkpoint_dir,
    torch_save_path): the file torch writes, byte for byte: everything the checkpoint holds,
    nested as torch nests it (an FSDP2 save: {"model": {fqn: tensor}, "optim": {"state":
    {fqn: {"exp_avg", "exp_avg_sq", "step"}}, "param_groups": [...]}}; torchtitan's: its
    top-level keys; HF Trainer / Accelerate model folders: {"model": ...}).

    dcp_checkpoint_dir may also be Accelerate's checkpoint folder or an HF Trainer FSDP
    checkpoint-N (or its output_dir: the newest complete checkpoint); the model folder is
    read, as torch would be given it. overwrite: replace an existing file, as torch.save
    does (default True; the old file stays whole until the new one is complete). Raises
    zckpt.Error with a one-line message naming the file on damaged or unreadable input
    (a flipped bit included), and leaves nothing at torch_save_path.
    """
    out = os.path.abspath(os.fspath(torch_save_path))
    o = N.ConsolidateOpts.new(overwrite=int(bool(overwrite)))
    run(N.lib.zck_dcp_to_torch_save, os.fsencode(os.fspath(dcp_checkpoint_dir)), os.fsencode(out), o, opts=o, progress=progress,
        label="dcp_to_torch_save")
    return out


def consolidate_safetensors_files(input_dir, output_dir, fqn_to_index_mapping=None, num_threads=1, *, overwrite=False,
                                  progress=None):
    """torch.distributed.checkpoint._consolidate_hf_safetensors.consolidate_safetensors_files(input_dir,
    output_dir, fqn_to_index_mapping, num_threads): the files torch writes, byte for byte
    (model-0000i-of-0000N.safetensors and model.safetensors.index.json), from a DCP saved with
    safetensors storage (HuggingFaceStorageWriter(save_distributed=True): the folder of its
    shard-*-model-*.safetensors files). fqn_to_index_mapping: {fqn: file index} as torch takes it;
    None: each tensor's file from the shard names, in the order of the checkpoint's metadata.
    num_threads: the copy's threads (the bytes do not depend on it). The folder appears at
    output_dir only once it is complete (with zckpt's manifest beside torch's files), so
    output_dir must not exist unless overwrite=True replaces it. Raises zckpt.Error with a
    one-line message on damaged input or on what torch cannot write (a 0-d or integer
    tensor, a mapping naming a tensor the checkpoint lacks or leaving one out).
    """
    out = os.path.abspath(os.fspath(output_dir))
    o = N.ConsolidateOpts.new(overwrite=int(bool(overwrite)), threads=max(1, int(num_threads)))
    with tempfile.TemporaryDirectory(prefix="zckpt-fqn-") as tmp:
        mapping = None
        if fqn_to_index_mapping is not None:
            mapping = os.path.join(tmp, "fqn_to_index.json")
            with open(mapping, "w") as f:
                json.dump({str(k): int(v) for k, v in fqn_to_index_mapping.items()}, f)
        run(N.lib.zck_dcp_consolidate_safetensors, os.fsencode(os.fspath(input_dir)), os.fsencode(out),
            os.fsencode(mapping) if mapping else None, o, opts=o, progress=progress,
            label="consolidate_safetensors_files")
    return out
