"""ctypes bindings over include/zck.h: the shared library and the structs the API uses.

The library is found next to this package (the wheel installs it as zckpt/_lib/libzckpt.so)
or at $ZCKPT_LIBRARY (a build tree). Structs are declared field for field as in zck.h; option
structs carry their size, so a newer library gives the fields this module does not know
their defaults.
"""
import ctypes
import glob
import os

_here = os.path.dirname(os.path.abspath(__file__))


def _find_library():
    env = os.environ.get("ZCKPT_LIBRARY")
    if env:
        return env
    for pattern in ("_lib/libzckpt.so", "_lib/libzckpt.so.*", "_lib/libzckpt*.dylib"):
        hits = sorted(glob.glob(os.path.join(_here, pattern)))
        if hits:
            return hits[0]
    raise ImportError("zckpt: libzckpt not found next to the package (set ZCKPT_LIBRARY to a built libzckpt.so)")


lib = ctypes.CDLL(_find_library())

# ---- status and errors
STATUS_NAMES = ["ok", "invalid argument", "I/O error", "not found", "format error", "truncated", "unsupported",
                "limit exceeded", "mismatch", "out of memory", "no space left", "already exists", "damaged",
                "no device", "internal error", "canceled"]
OK, ERR_DAMAGED, ERR_CANCELED = 0, 12, 15

lib.zck_last_error.restype = ctypes.c_char_p
lib.zck_last_error.argtypes = []
lib.zck_clear_error.restype = None
lib.zck_clear_error.argtypes = []
lib.zck_status_name.restype = ctypes.c_char_p
lib.zck_status_name.argtypes = [ctypes.c_int]
lib.zck_version.restype = ctypes.c_char_p
lib.zck_version.argtypes = []
lib.zck_parse_size.restype = ctypes.c_int
lib.zck_parse_size.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]

# ---- dtypes (enum zck_dtype)
DTYPES = ["invalid", "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
          "uint64", "uint32", "uint16", "uint8", "bool", "float8_e4m3fn", "float8_e5m2", "complex64", "complex128"]
lib.zck_dtype_parse.restype = ctypes.c_int
lib.zck_dtype_parse.argtypes = [ctypes.c_char_p]

PROGRESS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)


class _Opts(ctypes.Structure):
    """An option struct: zeros, its size when it has that field, then the given fields."""

    @classmethod
    def new(cls, **fields):
        o = cls()
        if cls._fields_[0][0] == "size":
            o.size = ctypes.sizeof(cls)
        for k, v in fields.items():
            setattr(o, k, v)
        return o


class JobSummary(ctypes.Structure):
    _fields_ = [("tensors", ctypes.c_uint64), ("files", ctypes.c_uint64), ("bytes", ctypes.c_uint64)]


class ConsolidateOpts(_Opts):
    _fields_ = [("size", ctypes.c_size_t), ("tag", ctypes.c_char_p), ("dtype", ctypes.c_int), ("max_shard_size", ctypes.c_uint64),
                ("exclude_frozen", ctypes.c_int), ("keep_tied", ctypes.c_int), ("safetensors", ctypes.c_int),
                ("torch_bin", ctypes.c_int), ("force", ctypes.c_int), ("threads", ctypes.c_uint),
                ("overwrite", ctypes.c_int), ("progress", PROGRESS), ("progress_ctx", ctypes.c_void_p),
                ("no_verify", ctypes.c_int), ("summary", ctypes.POINTER(JobSummary))]


class ReshardOpts(_Opts):
    _fields_ = [("size", ctypes.c_size_t), ("to_stage", ctypes.c_int), ("to_world_size", ctypes.c_uint32), ("sub_group_size", ctypes.c_uint64),
                ("tag", ctypes.c_char_p), ("threads", ctypes.c_uint), ("overwrite", ctypes.c_int),
                ("progress", PROGRESS), ("progress_ctx", ctypes.c_void_p), ("force", ctypes.c_int),
                ("no_verify", ctypes.c_int), ("summary", ctypes.POINTER(JobSummary)), ("to_tp_size", ctypes.c_uint32),
                ("model_config", ctypes.c_char_p), ("to_format", ctypes.c_int), ("to_dtype", ctypes.c_int),
                ("to_offload", ctypes.c_int), ("swap_min_bytes", ctypes.c_uint64), ("to_ep_size", ctypes.c_uint32)]


class UniversalOpts(_Opts):
    _fields_ = [("size", ctypes.c_size_t), ("format", ctypes.c_int), ("tag", ctypes.c_char_p), ("inject_missing_state", ctypes.c_int),
                ("level", ctypes.c_int), ("chunk_bytes", ctypes.c_uint64), ("threads", ctypes.c_uint),
                ("overwrite", ctypes.c_int), ("progress", PROGRESS), ("progress_ctx", ctypes.c_void_p),
                ("no_verify", ctypes.c_int), ("summary", ctypes.POINTER(JobSummary))]


class InspectOpts(_Opts):
    _fields_ = [("size", ctypes.c_size_t), ("json", ctypes.c_int), ("max_values", ctypes.c_int)]


VERIFY_OPTS_VERSION = 1


class VerifyOpts(_Opts):
    _fields_ = [("version", ctypes.c_uint), ("tag", ctypes.c_char_p), ("force", ctypes.c_int),
                ("skip_data", ctypes.c_int), ("threads", ctypes.c_uint), ("progress", PROGRESS),
                ("progress_ctx", ctypes.c_void_p)]


class VerifyFinding(ctypes.Structure):
    _fields_ = [("severity", ctypes.c_int), ("check", ctypes.c_char_p), ("file", ctypes.c_char_p),
                ("tensor", ctypes.c_char_p), ("offset", ctypes.c_int64), ("length", ctypes.c_uint64),
                ("message", ctypes.c_char_p)]


class VerifyReport(ctypes.Structure):
    _fields_ = [("path", ctypes.c_char_p), ("kind", ctypes.c_char_p), ("detail", ctypes.c_char_p),
                ("dir", ctypes.c_char_p), ("single_file", ctypes.c_int), ("manifest", ctypes.c_char_p),
                ("result", ctypes.c_int), ("files", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("records", ctypes.c_uint64), ("tensors", ctypes.c_uint64), ("n_findings", ctypes.c_size_t),
                ("findings", ctypes.POINTER(VerifyFinding))]


class TensorDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("numel", ctypes.c_uint64), ("nbytes", ctypes.c_uint64),
                ("alias_of", ctypes.c_int64), ("role", ctypes.c_int)]


ROLES = ["param", "frozen", "buffer"]

_c = ctypes.c_char_p
_v = ctypes.c_void_p
for name, args in [
    ("zck_consolidate", [_c, _c, ctypes.POINTER(ConsolidateOpts)]),
    ("zck_dcp_to_torch_save", [_c, _c, ctypes.POINTER(ConsolidateOpts)]),
    ("zck_dcp_consolidate_safetensors", [_c, _c, _c, ctypes.POINTER(ConsolidateOpts)]),
    ("zck_reshard", [_c, _c, ctypes.POINTER(ReshardOpts)]),
    ("zck_to_universal", [_c, _c, ctypes.POINTER(UniversalOpts)]),
    ("zck_inspect", [_c, ctypes.POINTER(InspectOpts), _v]),
    ("zck_verify", [_c, ctypes.POINTER(VerifyOpts), ctypes.POINTER(ctypes.POINTER(VerifyReport))]),
    ("zck_consolidate_open", [_c, ctypes.POINTER(ConsolidateOpts), ctypes.POINTER(_v)]),
    ("zck_state_dict_read", [_v, ctypes.POINTER(_v)]),
]:
    f = getattr(lib, name)
    f.restype = ctypes.c_int
    f.argtypes = args
lib.zck_sweep_temporaries.restype = ctypes.c_int
lib.zck_sweep_temporaries.argtypes = [_c, ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint)]
SWEEP_DEAD = 0
lib.zck_verify_report_free.restype = None
lib.zck_verify_report_free.argtypes = [ctypes.POINTER(VerifyReport)]
lib.zck_state_dict_count.restype = ctypes.c_size_t
lib.zck_state_dict_count.argtypes = [_v]
lib.zck_state_dict_tensor.restype = ctypes.POINTER(TensorDesc)
lib.zck_state_dict_tensor.argtypes = [_v, ctypes.c_size_t]
lib.zck_state_dict_free.restype = None
lib.zck_state_dict_free.argtypes = [_v]

# ---- libc, for zck_inspect's FILE * (an in-memory stream)
libc = ctypes.CDLL(None)
libc.open_memstream.restype = _v
libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
libc.fclose.restype = ctypes.c_int
libc.fclose.argtypes = [_v]
libc.free.restype = None
libc.free.argtypes = [_v]
