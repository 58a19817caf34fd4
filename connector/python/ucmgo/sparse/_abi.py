"""The retriever ABI of libucmgo.so (ucmgo.h, "RETRIEVER") declared for ctypes."""

import ctypes

from .. import _lib

# ucmgo.h's UCMGO_RM_* methods and the dtypes a retrieval names (UCMGO_DTYPE_*).
RM_DOT = 1
RM_MAXDOT = 2
RM_SOFTMAX = 3
DTYPE_FLOAT16 = 1
DTYPE_FLOAT32 = 5


class Retrieval(ctypes.Structure):
    """ucmgo.h's ucmgo_retrieval: size must be ctypes.sizeof(Retrieval)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("method", ctypes.c_int32),
        ("topk", ctypes.c_int32),
        ("batch", ctypes.c_int64),
        ("dim", ctypes.c_int64),
        ("q", ctypes.c_void_p),
        ("reprs", ctypes.c_void_p),
        ("n_reprs", ctypes.c_int64),
        ("cand", ctypes.c_void_p),
        ("cand_width", ctypes.c_int64),
        ("out_idx", ctypes.c_void_p),
        ("out_scores", ctypes.c_void_p),
        ("out_count", ctypes.c_void_p),
        ("q_dtype", ctypes.c_int32),
        ("r_dtype", ctypes.c_int32),
        ("q_heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("rows_per_block", ctypes.c_int64),
        ("channels", ctypes.c_void_p),
        ("kept", ctypes.c_int64),
        ("row_topk", ctypes.c_void_p),
        ("init", ctypes.c_int32),
        ("local", ctypes.c_int32),
    ]


_declared = None


def get():
    """The library with the retriever entry points declared (on first use)."""
    global _declared
    if _declared is None:
        lib = _lib.get()
        _i64, _i32, _p = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
        _r = ctypes.POINTER(Retrieval)
        for name, res, args in [
            ("ucmgo_retriever_new", _i64, [_i32, _p, ctypes.c_size_t]),
            ("ucmgo_retriever_free", _i32, [_i64]),
            ("ucmgo_retrieve_submit", _i64, [_i64, _r]),
            ("ucmgo_retrieve_check", _i32, [_i64, _i64, ctypes.POINTER(_i32)]),
            ("ucmgo_retrieve_wait", _i32, [_i64, _i64]),
            ("ucmgo_retrieve_release", _i32, [_i64, _i64]),
            ("ucmgo_retrieve", _i32, [_i64, _r]),
        ]:
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        _declared = lib
    return _declared


def error(call: str, status: int) -> RuntimeError:
    """The RuntimeError a failed call raises: the call, UCM's status name and the library's
    message (ucmgo_last_error of this thread)."""
    return RuntimeError("%s: %s (%s %d)" % (call, _lib.last_error(), _lib.STATUS_NAMES.get(status, "status"), status))
