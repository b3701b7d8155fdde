"""zckpt.dcp: torch Distributed Checkpoint (DCP) helpers shaped like torch's own.

    from zckpt.dcp import dcp_to_torch_save
    dcp_to_torch_save("out/checkpoint-500/pytorch_model_fsdp_0", "model.pt")

The DCP folder is read by libzckpt (no torch, no process group, the whole model never in
memory), every chunk's zip CRC-32 is checked as it streams (torch checks none), and the file
appears at its name only once it is complete.
"""
import os
import shutil

from ._run import Error

__all__ = ["dcp_to_torch_save"]


def dcp_to_torch_save(dcp_checkpoint_dir, torch_save_path, *, dtype=None, overwrite=True, threads=0, progress=None,
                      no_verify=False):
    """The model weights of a torch Distributed Checkpoint as one torch.save file, as
    torch.distributed.checkpoint.format_utils.dcp_to_torch_save(dcp_checkpoint_dir,
    torch_save_path) writes them: the same names, dtypes, shapes and bits (tied weights stay
    two tensors, as DCP stores them).

    What differs from torch's: the file holds the model state dict itself, {fqn: tensor}
    (torch's ["model"] entry; for torchtitan's layout, its top-level tensors), not torch's
    whole loaded dict; the optimizer state and non-tensor entries are left out (a resume reads
    the DCP folder itself). dcp_checkpoint_dir may also be Accelerate's checkpoint folder or
    an HF Trainer FSDP checkpoint-N (or its output_dir: the newest complete checkpoint).

    dtype: cast every floating tensor (round to nearest even), as zckpt.consolidate.
    overwrite: replace an existing file, as torch.save does (default True; the old file
    stays whole until the new one is complete). Raises zckpt.Error with a one-line message
    naming the file on damaged or unreadable input, and leaves nothing at torch_save_path.
    """
    from . import consolidate, inspect
    kind = inspect(dcp_checkpoint_dir).get("format")
    if kind != "dcp":   # consolidate would take a DeepSpeed checkpoint too: not what this name promises
        raise Error(f"{os.fspath(dcp_checkpoint_dir)}: not a torch Distributed Checkpoint ({kind})", "format error")
    out = os.path.abspath(os.fspath(torch_save_path))
    if os.path.isdir(out):
        raise Error(f"{out}: is a folder (torch_save_path names the file to write)", "exists")
    if not overwrite and os.path.lexists(out):
        raise Error(f"{out}: exists (pass overwrite=True to replace it)", "exists")
    opts = dict(dtype=dtype, format="pt", overwrite=True, threads=threads, progress=progress, no_verify=no_verify)
    if out.endswith((".pt", ".bin")):   # a name libzckpt writes as one torch file
        consolidate(dcp_checkpoint_dir, out, **opts)
        return out
    # Another name (model.pth, a name without suffix): written as <stem>.bin, so that the zip's
    # archive folder is the stem as torch.save names it, inside a temporary folder that
    # zckpt.sweep_temporaries recognises, then renamed into place.
    parent, name = os.path.split(out)
    stem = name.rsplit(".", 1)[0]
    tmp = os.path.join(parent, f".{name}.zck-tmp-{os.getpid()}")
    os.makedirs(tmp)
    try:
        written = os.path.join(tmp, f"{stem}.bin")
        consolidate(dcp_checkpoint_dir, written, **opts)
        os.replace(written, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
