"""DeepSpeed's deepspeed.utils.zero_to_fp32 functions, same signatures and results.

The state dict is read by libzckpt straight from the rank files into the tensors' own
memory (one pass, in parallel, no temporary file, no DeepSpeed or pickle loading of the
optimizer files); convert_zero_checkpoint_to_fp32_state_dict writes through the
consolidate job. Tensors are torch tensors when torch is installed, numpy arrays
otherwise (bfloat16 then needs ml_dtypes).
"""
import ctypes
import os
import shutil
import tempfile

from . import _native as N
from ._run import Error, run

_TORCH_NAMES = {1: "float64", 2: "float32", 3: "float16", 4: "bfloat16", 5: "int64", 6: "int32", 7: "int16",
                8: "int8", 9: "uint64", 10: "uint32", 11: "uint16", 12: "uint8", 13: "bool", 14: "float8_e4m3fn",
                15: "float8_e5m2", 16: "complex64", 17: "complex128"}


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def _alloc_torch(torch, d, shape):
    dt = getattr(torch, _TORCH_NAMES[d.dtype], None)
    if dt is None:
        raise Error(f"{d.name.decode()}: dtype {_TORCH_NAMES[d.dtype]} not in this torch", "unsupported")
    t = torch.empty(shape, dtype=dt)
    return t, t.data_ptr() if t.numel() else None


def _alloc_numpy(np, d, shape):
    name = _TORCH_NAMES[d.dtype]
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        try:
            import ml_dtypes
            dt = getattr(ml_dtypes, name)
        except ImportError:
            raise Error(f"{d.name.decode()}: {name} needs torch or ml_dtypes: pip install 'zckpt[torch]' or ml_dtypes",
                        "unsupported") from None
    else:
        dt = np.dtype("bool" if name == "bool" else name)
    a = np.empty(shape, dtype=dt)
    return a, a.ctypes.data if a.size else None


def _read_state_dict(checkpoint_dir, tag, exclude_frozen_parameters, progress=None, threads=0):
    torch = _torch()
    np = None
    if torch is None:
        try:
            import numpy as np
        except ImportError:
            raise Error("get_fp32_state_dict_from_zero_checkpoint needs torch or numpy: pip install 'zckpt[torch]' or numpy",
                        "unsupported") from None
    o = N.ConsolidateOpts.new(tag=None if tag is None else os.fsencode(tag), exclude_frozen=int(bool(
        exclude_frozen_parameters)), safetensors=1, threads=threads)
    sd = ctypes.c_void_p()
    run(N.lib.zck_consolidate_open, os.fsencode(checkpoint_dir), o, ctypes.byref(sd), progress=False)
    try:
        n = N.lib.zck_state_dict_count(sd)
        descs = [N.lib.zck_state_dict_tensor(sd, i).contents for i in range(n)]
        keep = [True] * n
        for i, d in enumerate(descs):
            # DeepSpeed files zero-element trainable params with the frozen ones, and
            # exclude_frozen_parameters drops them too (the library keeps them)
            if exclude_frozen_parameters and d.role == 1 and d.numel == 0:
                keep[i] = False
            if d.alias_of >= 0 and not keep[d.alias_of]:
                keep[i] = False
        tensors = [None] * n
        ptrs = (ctypes.c_void_p * max(n, 1))()
        for i, d in enumerate(descs):
            if d.alias_of >= 0:
                continue
            shape = tuple(d.shape[k] for k in range(d.ndim))
            tensors[i], ptrs[i] = _alloc_torch(torch, d, shape) if torch is not None else _alloc_numpy(np, d, shape)
        run(N.lib.zck_state_dict_read, sd, ptrs, opts=o, progress=progress, label="read")
        out = {}
        for i, d in enumerate(descs):
            if keep[i]:
                out[d.name.decode()] = tensors[d.alias_of] if d.alias_of >= 0 else tensors[i]
        return out
    finally:
        N.lib.zck_state_dict_free(sd)


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, exclude_frozen_parameters=False,
                                             lazy_mode=False):
    """As deepspeed.utils.zero_to_fp32's: the consolidated state dict of a ZeRO 1/2/3
    checkpoint (checkpoint_dir holds `latest` and the tag folders), on the CPU: fp32
    trainable params, frozen params in their saved 16-bit dtype, buffers as saved; tied
    names are the same tensor object. lazy_mode is accepted; the tensors are real either
    way (they have .contiguous(), as DeepSpeed's lazy ones do)."""
    return _read_state_dict(checkpoint_dir, tag, exclude_frozen_parameters)


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size="5GB",
                                               safe_serialization=False, tag=None, exclude_frozen_parameters=False):
    """As deepspeed.utils.zero_to_fp32's: writes the fp32 state dict into output_dir as
    model.safetensors (safe_serialization) or pytorch_model.bin, sharded above
    max_shard_size with an index, next to whatever output_dir already holds. The files
    are made by libzckpt under a temporary name and moved in whole."""
    from . import consolidate
    if max_shard_size is None:
        max_shard_size = 1 << 62  # one file, as DeepSpeed without sharding
    os.makedirs(output_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".zckpt-convert-", dir=output_dir)
    try:
        staged = os.path.join(tmp, "out")
        consolidate(checkpoint_dir, staged, tag=tag, dtype="fp32", max_shard_size=max_shard_size,
                    exclude_frozen=exclude_frozen_parameters, format="safetensors" if safe_serialization else "pt")
        weights = "model" if safe_serialization else "pytorch_model"
        for name in sorted(os.listdir(staged)):
            if name.startswith(weights):  # the weights and their index; not the side files
                os.replace(os.path.join(staged, name), os.path.join(output_dir, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """As deepspeed.utils.zero_to_fp32's: moves model to the CPU and loads the fp32
    weights into it (strict=False); returns the model."""
    state_dict = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state_dict, strict=False)
    return model
