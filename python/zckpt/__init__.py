"""zckpt: DeepSpeed ZeRO checkpoints without DeepSpeed, at the speed of the disk.

Jobs (each one atomic: on any error, or when canceled, nothing is left at OUT):
    consolidate(checkpoint, out, ...)     whole tensors, equal bit for bit to zero_to_fp32
    reshard(checkpoint, out, ...)         another ZeRO stage and/or world size
    to_universal(checkpoint, out, ...)    DeepSpeed's universal checkpoint, or one HDF5 file
    verify(path, ...) -> VerifyReport     structure and checksums
    inspect(path) -> dict                 what a checkpoint or tensor file holds
    sweep_temporaries(folder)             what writers killed before their commit left

DeepSpeed's zero_to_fp32 functions, same signatures and results, no DeepSpeed needed:
    get_fp32_state_dict_from_zero_checkpoint, convert_zero_checkpoint_to_fp32_state_dict,
    load_state_dict_from_zero_checkpoint (also in zckpt.zero_to_fp32).

torch's dcp_to_torch_save(dcp_checkpoint_dir, torch_save_path): torch's file byte for byte
(the whole state dict, nested as torch nests it), every chunk's CRC checked (also in
zckpt.dcp).

Failures raise zckpt.Error with the library's one-line message. Progress: pass
progress=callable(done_bytes, total_bytes) (a true return value cancels the job), or
leave it None for a tqdm bar when tqdm is installed and stderr is a terminal. Ctrl-C
cancels cleanly and raises KeyboardInterrupt.

no_verify=True skips the checksums of the bytes a job reads (the command's --no-verify).

Hugging Face Trainer integration (zckpt.hf, imported on its own): ZckptCallback (manifest
after each save, CPU consolidation of every or the best checkpoint) and prepare_resume
(reshard a checkpoint-N for another world size or ZeRO stage before resuming).

Importing zckpt needs neither torch nor numpy.
"""
import json
import os
from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional

from . import _native as N
from ._run import Canceled, Error, error_from, run

__all__ = ["Error", "Canceled", "consolidate", "reshard", "to_universal", "verify", "inspect", "VerifyReport",
           "VerifyFinding", "version", "sweep_temporaries", "Swept", "get_fp32_state_dict_from_zero_checkpoint",
           "convert_zero_checkpoint_to_fp32_state_dict", "load_state_dict_from_zero_checkpoint", "dcp_to_torch_save"]

__version__ = N.lib.zck_version().decode()


def version():
    """The version of the loaded libzckpt."""
    return N.lib.zck_version().decode()


def _b(s):
    return None if s is None else os.fsencode(s)


def _dtype(name, what="dtype"):
    if name is None:
        return 0
    name = str(name)
    if name.startswith("torch."):
        name = name[6:]
    t = N.lib.zck_dtype_parse(name.encode())
    if t == 0:
        raise Error(f"{what} {name!r}: not a dtype zckpt knows", "invalid argument")
    return t


def _size(v):
    """max_shard_size as bytes: an int, or a string as huggingface_hub reads it ("5GB", "500MB";
    also "10GiB", "5G"), read by the library's one parser so that the CLI and Python agree."""
    if v is None:
        return 0
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    out = N.ctypes.c_uint64()
    st = N.lib.zck_parse_size(str(v).encode(), N.ctypes.byref(out))
    if st:
        raise error_from(st)
    return out.value


def consolidate(checkpoint, out, *, tag=None, dtype=None, max_shard_size=None, exclude_frozen=False,
                keep_tied=False, format="safetensors", force=False, overwrite=False, threads=0, progress=None,
                no_verify=False):
    """A DeepSpeed ZeRO-1/2/3 checkpoint (save root with `latest`, tag folder or HF
    checkpoint-N/), or a universal checkpoint made of one (its folder, the folder holding
    latest_universal, or the HDF5 file), to whole tensors at OUT: a folder
    (model.safetensors or shards + index), or one *.safetensors / *.bin file. format:
    "safetensors", "pt" or "both" (folders)."""
    if format not in ("safetensors", "pt", "both"):
        raise Error(f"format {format!r}: use safetensors, pt or both", "invalid argument")
    o = N.ConsolidateOpts.new(tag=_b(tag), dtype=_dtype(dtype), max_shard_size=_size(max_shard_size),
                              exclude_frozen=int(bool(exclude_frozen)), keep_tied=int(bool(keep_tied)),
                              safetensors=int(format != "pt"), torch_bin=int(format != "safetensors"),
                              force=int(bool(force)), threads=threads, overwrite=int(bool(overwrite)),
                              no_verify=int(bool(no_verify)))
    run(N.lib.zck_consolidate, _b(checkpoint), _b(out), o, opts=o, progress=progress, label="consolidate")
    return os.fspath(out)


def reshard(checkpoint, out, *, world_size=None, stage=None, sub_group_size=None, tag=None, force=False,
            overwrite=False, threads=0, progress=None, no_verify=False, tp_size=None, model_config=None,
            format="deepspeed", dtype=None, offload="keep", swap_min_bytes=None, ep_size=None):
    """A DeepSpeed checkpoint (or a universal folder / HDF5 file) as a DeepSpeed checkpoint
    for another ZeRO stage and/or world size; OUT is a new save root (OUT/latest, OUT/<tag>/).
    tp_size: write AutoTP files at that TP size (default: TP 1); another TP size than the
    source's needs the model's config.json: model_config, else the one beside the checkpoint.
    format="dcp": OUT is the torch Distributed Checkpoint FSDP2 saves at world_size ranks
    (weights, Adam state and param groups keyed by FQN), for dcp.load + set_state_dict;
    format="dcp-accelerate": the same items as Accelerate / the HF Trainer save an FSDP model
    (FSDP1 or FSDP2), OUT/pytorch_model_fsdp_0/ and OUT/optimizer_0/, for accelerator.load_state.
    checkpoint may also be a torch Distributed Checkpoint (FSDP2, Accelerate, HF Trainer FSDP): OUT is then
    the DeepSpeed checkpoint of a ZeRO-`stage` (default 3) run at world_size ranks (default: the DCP's);
    dtype ("bf16", "fp32") is that run's 16-bit dtype (default: the DCP weights').
    offload: where a DeepSpeed target keeps its optimizer state: "keep" (the source's: NVMe swap
    files for an NVMe-offloaded ZeRO-3 source), "none" (the rank files) or "nvme" (ZeRO-3 swap
    files in offloaded_tensors/); swap_min_bytes: the smallest fp32 partition DeepSpeed swaps, when
    the source's swaps do not say (as zckpt reshard --swap-min-bytes). ep_size: a DeepSpeed AutoEP
    source's expert-parallel size in the target (as zckpt reshard --to-ep-size; default: the source's)."""
    formats = ("deepspeed", "dcp", "dcp-accelerate")   # enum zck_reshard_format's order
    if format not in formats:
        raise Error(f"format {format!r}: use deepspeed, dcp or dcp-accelerate", "invalid argument")
    offloads = ("keep", "none", "nvme")   # enum zck_reshard_offload's order
    if offload not in offloads:
        raise Error(f"offload {offload!r}: use keep, none or nvme", "invalid argument")
    o = N.ReshardOpts.new(to_stage=stage or 0, to_world_size=world_size or 0, sub_group_size=sub_group_size or 0,
                          tag=_b(tag), threads=threads, overwrite=int(bool(overwrite)), force=int(bool(force)),
                          no_verify=int(bool(no_verify)), to_tp_size=tp_size or 0, model_config=_b(model_config),
                          to_format=formats.index(format), to_dtype=_dtype(dtype),
                          to_offload=offloads.index(offload), swap_min_bytes=_size(swap_min_bytes),
                          to_ep_size=ep_size or 0)
    run(N.lib.zck_reshard, _b(checkpoint), _b(out), o, opts=o, progress=progress, label="reshard")
    return os.fspath(out)


def to_universal(checkpoint, out, *, format="deepspeed", tag=None, inject_missing_state=False, level=0,
                 chunk_bytes=0, overwrite=False, threads=0, progress=None, no_verify=False):
    """A DeepSpeed checkpoint with its optimizer state, or a torch Distributed Checkpoint (taken as its
    default reshard, ZeRO-3), as a universal checkpoint: format "deepspeed" (the folder ds_to_universal.py
    writes) or "hdf5" (one file)."""
    if format not in ("deepspeed", "ds", "hdf5", "h5"):
        raise Error(f"format {format!r}: use deepspeed or hdf5", "invalid argument")
    o = N.UniversalOpts.new(format=1 if format in ("hdf5", "h5") else 0, tag=_b(tag),
                            inject_missing_state=int(bool(inject_missing_state)), level=level,
                            chunk_bytes=chunk_bytes, threads=threads, overwrite=int(bool(overwrite)),
                            no_verify=int(bool(no_verify)))
    run(N.lib.zck_to_universal, _b(checkpoint), _b(out), o, opts=o, progress=progress, label="to-universal")
    return os.fspath(out)


@dataclass
class VerifyFinding:
    severity: str           # "note", "warning", "damage", "unchecked"
    check: str
    file: Optional[str]
    tensor: Optional[str]
    offset: int
    length: int
    message: str


@dataclass
class VerifyReport:
    path: str
    kind: str
    detail: str
    dir: Optional[str]
    single_file: bool
    manifest: Optional[str]
    result: str             # "clean", "damaged", "unchecked"
    files: int
    bytes: int
    records: int
    tensors: int
    findings: List[VerifyFinding] = field(default_factory=list)

    @property
    def clean(self):
        return self.result == "clean"

    def __bool__(self):
        return self.clean


def _s(b):
    return None if b is None else b.decode("utf-8", "replace")


def verify(path, *, tag=None, force=False, skip_data=False, threads=0, progress=None):
    """Checks structure everywhere and checksums where a manifest exists. Returns a
    VerifyReport (result "clean", "damaged" or "unchecked"); raises Error only when the
    path cannot be checked at all."""
    o = N.VerifyOpts.new(version=N.VERIFY_OPTS_VERSION, tag=_b(tag), force=int(bool(force)),
                         skip_data=int(bool(skip_data)), threads=threads)
    rp = N.ctypes.POINTER(N.VerifyReport)()
    try:
        st, err = run(N.lib.zck_verify, _b(path), o, N.ctypes.byref(rp), opts=o, progress=progress, label="verify",
                      damaged_is_result=True)
        r = rp.contents
        sev = ["note", "warning", "damage", "unchecked"]
        findings = [VerifyFinding(sev[f.severity] if f.severity < 4 else str(f.severity), _s(f.check), _s(f.file),
                                  _s(f.tensor), f.offset, f.length, _s(f.message))
                    for f in (r.findings[i] for i in range(r.n_findings))]
        return VerifyReport(_s(r.path), _s(r.kind), _s(r.detail) or "", _s(r.dir), bool(r.single_file),
                            _s(r.manifest), ["clean", "damaged", "unchecked"][r.result], r.files, r.bytes,
                            r.records, r.tensors, findings)
    finally:
        if rp:
            N.lib.zck_verify_report_free(rp)


def inspect(path, *, max_values=0):
    """What a .pt/.bin, safetensors file or index, HF or DeepSpeed checkpoint holds, as the
    dict `zckpt inspect --json` prints."""
    buf = N.ctypes.c_void_p()
    size = N.ctypes.c_size_t()
    stream = N.libc.open_memstream(N.ctypes.byref(buf), N.ctypes.byref(size))
    if not stream:
        raise Error("out of memory", "out of memory")
    o = N.InspectOpts.new(json=1, max_values=max_values)
    try:
        run(N.lib.zck_inspect, _b(path), o, stream, progress=False)
    finally:
        N.libc.fclose(stream)
        text = N.ctypes.string_at(buf, size.value) if buf else b""
        N.libc.free(buf)
    return json.loads(text)


class Swept(NamedTuple):
    removed: int    # temporaries removed
    restored: int   # earlier versions put back at their name


def sweep_temporaries(folder):
    """Sweeps FOLDER's entries (not below) of what writers that died before their commit
    left: their temporaries (".NAME.zck-tmp-PID", files or trees) go, and an earlier NAME a
    dying commit had moved aside comes back when NAME is missing. Entries of writers still
    running are left alone. Every job does this in its OUT's folder before it writes; call
    it for a folder no job will write into again (an HF output_dir after a killed run)."""
    removed, restored = N.ctypes.c_uint(), N.ctypes.c_uint()
    st = N.lib.zck_sweep_temporaries(_b(os.fspath(folder)), N.SWEEP_DEAD, N.ctypes.byref(removed),
                                     N.ctypes.byref(restored))
    if st:
        raise error_from(st)
    return Swept(removed.value, restored.value)


from .zero_to_fp32 import (convert_zero_checkpoint_to_fp32_state_dict,  # noqa: E402
                           get_fp32_state_dict_from_zero_checkpoint, load_state_dict_from_zero_checkpoint)
from .dcp import dcp_to_torch_save  # noqa: E402
