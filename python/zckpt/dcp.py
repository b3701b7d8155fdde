"""zckpt.dcp: torch Distributed Checkpoint (DCP) helpers shaped like torch's own.

    from zckpt.dcp import dcp_to_torch_save
    dcp_to_torch_save("out/checkpoint-500/pytorch_model_fsdp_0", "full.pt")
    torch.load("full.pt")["model"]

The DCP folder is read by libzckpt (no torch, no process group, the whole model never in
memory), every chunk's zip CRC-32 is checked as it streams (torch checks none), and the file
appears at its name only once it is complete.
"""
import os

from . import _native as N
from ._run import run

__all__ = ["dcp_to_torch_save"]


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
