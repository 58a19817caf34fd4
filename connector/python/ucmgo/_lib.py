"""Loading libucmgo.so and declaring its C ABI (ucmgo.h) for ctypes."""

import ctypes
import os
from pathlib import Path

# UCM's status codes (ucmgo.h).
# BEGIN STATUS CODES (generated from connector/internal/statuscodes; go generate ./connector/)
OK = 0
ERROR = -1  # a failure no other code names
EPARAM = -50000  # bad argument: pointer, count, size, shard index, handle
EOOM = -50001  # out of memory (staging)
EOSERROR = -50002  # the file system failed an operation
EDUPLICATE = -50003  # the same block twice in one call, or created twice
ERETRY = -50004  # try again (store directory locked by another process)
ENOOBJ = -50005  # no such block, or no such task
ESERIALIZE = -50006  # not returned by UCM-Go
EDESERIALIZE = -50007  # stored bytes failed a check: the block is a miss now
EUNSUPPORTED = -50008  # schema mismatch, or an operation this role does not do
ENOSPACE = -50009  # no space on the tier or in staging memory
ETIMEOUT = -50010  # the task outlived timeout_ms and was cancelled

STATUS_NAMES = {
    OK: "OK",
    ERROR: "ERROR",
    EPARAM: "EPARAM",
    EOOM: "EOOM",
    EOSERROR: "EOSERROR",
    EDUPLICATE: "EDUPLICATE",
    ERETRY: "ERETRY",
    ENOOBJ: "ENOOBJ",
    ESERIALIZE: "ESERIALIZE",
    EDESERIALIZE: "EDESERIALIZE",
    EUNSUPPORTED: "EUNSUPPORTED",
    ENOSPACE: "ENOSPACE",
    ETIMEOUT: "ETIMEOUT",
}
# END STATUS CODES

ID_BYTES = 16


def _candidates():
    env = os.environ.get("UCMGO_LIB")
    if env:
        yield Path(env)
    here = Path(__file__).resolve().parent
    yield here / "libucmgo.so"
    # A checkout: connector/python/ucmgo -> <repo>/lib (make lib).
    yield here.parents[2] / "lib" / "libucmgo.so"


def _load():
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.is_file():
            # Lazy binding: the library links NVML's functions (go-nvml) that resolve only once
            # NVML is loaded, and ctypes' default (RTLD_NOW) refuses a library with unresolved
            # functions where no NVIDIA driver is installed.
            return ctypes.CDLL(str(path), mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    raise ImportError(
        "libucmgo.so not found (tried %s): run `make lib` or set UCMGO_LIB" % ", ".join(tried)
    )


_lib = None


def get():
    """Returns the loaded library, loading it on first use.

    Loading starts the Go runtime in this process: a process that forks afterwards must not use
    the library in the child (use the "spawn" start method for workers, as vLLM does with CUDA).
    Loading lazily lets a parent import ucmgo and fork before any store is opened.
    """
    global _lib
    if _lib is None:
        lib = _load()
        _i64, _i32, _u64, _sz = ctypes.c_int64, ctypes.c_int32, ctypes.c_uint64, ctypes.c_size_t
        _p = ctypes.c_void_p
        for name, res, args in [
            ("ucmgo_open", _i64, [ctypes.c_char_p]),
            ("ucmgo_open_env", _i64, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]),
            ("ucmgo_close", _i32, [_i64]),
            ("ucmgo_lookup", _i32, [_i64, _p, _sz, _p]),
            ("ucmgo_lookup_on_prefix", _i32, [_i64, _p, _sz, ctypes.POINTER(_i64)]),
            ("ucmgo_prefetch", _i32, [_i64, _p, _sz]),
            ("ucmgo_load", _i64, [_i64, _p, _p, _sz, _p, _sz]),
            ("ucmgo_dump", _i64, [_i64, _p, _p, _sz, _p, _sz, _u64]),
            ("ucmgo_wait", _i32, [_i64, _i64, _p, _sz]),
            ("ucmgo_check", _i32, [_i64, _i64, ctypes.POINTER(_i32)]),
            ("ucmgo_create", _i32, [_i64, _p, _sz, _p]),
            ("ucmgo_commit", _i32, [_i64, _p, _sz, _i32]),
            ("ucmgo_stats", _i64, [_i64, _p, _sz]),
            ("ucmgo_last_error", ctypes.c_char_p, []),
        ]:
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        _lib = lib
    return _lib


class TaskHandle(ctypes.c_int64):
    """A task handle as the fast entry points return it (fast()): ctypes hands back an instance
    of a c_int64 subclass as it is, so ucmgo_wait takes it back without a conversion."""


class Fast:
    """ucmgo_load, ucmgo_dump and ucmgo_wait declared again without argtypes, for small calls.

    With argtypes, ctypes calls a converter per argument on every call: for the 4-block task of a
    layer-wise load that is a third of the package's own instructions per load and wait. Without
    them it passes ctypes instances and bytes (as pointers) as they are. So the caller must pass
    exactly: handles as c_int64 (TaskHandle for a task), counts as c_size_t, pointers as bytes
    or None, prerequisite as c_uint64. UcmGoStore does; nothing else should use these."""

    def __init__(self, lib):
        for name, res in (("ucmgo_load", TaskHandle), ("ucmgo_dump", TaskHandle), ("ucmgo_wait", ctypes.c_int32)):
            fn = lib._FuncPtr((name, lib))  # a function object of its own: argtypes unset
            fn.restype = res
            setattr(self, name, fn)


_fast = None


def fast() -> Fast:
    """The fast entry points (Fast), made on first use."""
    global _fast
    if _fast is None:
        _fast = Fast(get())
    return _fast


def environment():
    """The process's environment as ucmgo_open_env takes it: a NULL-terminated array of
    b"NAME=value" strings. The library cannot see changes made to os.environ after it was
    loaded (the Go runtime keeps the environment the process started with), so every open
    passes the current one."""
    env = getattr(os, "environb", None)
    if env is not None:
        items = [k + b"=" + v for k, v in env.items()]
    else:  # pragma: no cover - platforms without environb
        items = [("%s=%s" % kv).encode("utf-8", "surrogateescape") for kv in os.environ.items()]
    arr = (ctypes.c_char_p * (len(items) + 1))(*items)
    arr[len(items)] = None
    return arr


def last_error() -> str:
    msg = get().ucmgo_last_error()
    return msg.decode("utf-8", "replace") if msg else ""
