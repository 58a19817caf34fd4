"""UcmGoStore: UCM's store interface (UcmKVStoreBaseV1) over libucmgo.so."""

import array
import ctypes
import json
from itertools import chain as _chain
from abc import ABC, abstractmethod
from typing import Dict, List, Sequence

from . import _lib

try:  # numpy is optional: address tables may be numpy arrays, results stay lists
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only without numpy
    _np = None
_U64 = _np.dtype(_np.uint64) if _np is not None else None

try:  # UCM's base classes when UCM is installed, so that its factory accepts this store
    from ucm.store.ucmstore_v1 import Task as _UcmTask
    from ucm.store.ucmstore_v1 import UcmKVStoreBaseV1 as _UcmBase

    HAVE_UCM = True
except ImportError:
    HAVE_UCM = False

    class _UcmTask(ABC):  # noqa: D401 - same shape as UCM's
        """An asynchronous task handle (UCM's ucm.store.ucmstore_v1.Task)."""

    class _UcmBase(ABC):
        """UCM's UcmKVStoreBaseV1, for when the ucm package is not installed."""

        def __init__(self, config: Dict[str, object]) -> None:
            self.config = config

        @abstractmethod
        def cc_store(self) -> int: ...

        @abstractmethod
        def lookup(self, block_ids: List[bytes]) -> List[bool]: ...

        @abstractmethod
        def lookup_on_prefix(self, block_ids: List[bytes]) -> int: ...

        @abstractmethod
        def prefetch(self, block_ids: List[bytes]) -> None: ...

        @abstractmethod
        def load(self, block_ids, shard_index, dst_tensor): ...

        @abstractmethod
        def dump(self, block_ids, shard_index, src_tensor): ...

        @abstractmethod
        def load_data(self, block_ids, shard_index, dst_addr): ...

        @abstractmethod
        def dump_data(self, block_ids, shard_index, src_addr, prerequisite_handle: int = 0): ...

        @abstractmethod
        def wait(self, task) -> None: ...

        @abstractmethod
        def check(self, task) -> bool: ...


UcmKVStoreBaseV1 = _UcmBase


class UcmGoError(RuntimeError):
    """A failed store call: status is UCM's code (ucmgo.EPARAM, ...), the message says why.

    It is a RuntimeError, as UCM's stores raise, so UCM's connector catches it where it catches
    theirs.
    """

    def __init__(self, status: int, message: str):
        super().__init__("%s (%s %d)" % (message, _lib.STATUS_NAMES.get(status, "status"), status))
        self.status = status


class UcmGoTask(_UcmTask):
    """A transfer in flight. failed is set by wait: one bool per block (True: the block failed
    and must be recomputed), or None before wait."""

    __slots__ = ("task_id", "blocks", "failed", "_keep", "_handle")

    def __init__(self, task_id: int, blocks: int, keep, handle=None):
        self.task_id = task_id
        self.blocks = blocks
        self.failed = None
        self._keep = keep  # the tensors stay alive until wait
        self._handle = handle  # task_id as a _lib.TaskHandle when the fast entry points made it

    def __repr__(self):
        return "UcmGoTask(%d, blocks=%d)" % (self.task_id, self.blocks)


def _ids(block_ids: Sequence[bytes]):
    """Joins the ids into one buffer, checking each is 16 raw bytes (None for no ids)."""
    try:  # the common case at C speed: a per-task cost of the connector's hot path
        joined = b"".join(block_ids)
    except TypeError:
        joined = None
    # Equal lengths adding up to 16 bytes per id: each is 16 bytes.
    if joined is not None and len(joined) == _lib.ID_BYTES * len(block_ids) and len(set(map(len, block_ids))) <= 1:
        return joined or None  # ctypes passes a bytes object's buffer
    for i, b in enumerate(block_ids):  # name the first bad id
        if not isinstance(b, (bytes, bytearray)) or len(b) != _lib.ID_BYTES:
            raise UcmGoError(
                _lib.EPARAM,
                "block id at position %d: want %d raw bytes, got %r" % (i, _lib.ID_BYTES, type(b).__name__ if not isinstance(b, (bytes, bytearray)) else len(b)),
            )
    raise UcmGoError(_lib.EPARAM, "block ids: want %d raw bytes each" % _lib.ID_BYTES)  # not reached


# Small calls (up to the 32 blocks the library queues without entering Go, queue.c) take the
# fast entry points (_lib.Fast): their counts as c_size_t objects made once, their failure
# masks from array types made once.
_SMALL = 32
_SIZES = [ctypes.c_size_t(n) for n in range(_SMALL + 1)]
_MASKS = [ctypes.c_uint8 * max(n, 1) for n in range(_SMALL + 1)]
_NO_EVENT = ctypes.c_uint64(0)
_WHOLE = -1  # the shard index of a whole block


def _jsonable(v):
    if _np is not None and isinstance(v, _np.generic):
        return v.item()
    if isinstance(v, (set, tuple)):
        return list(v)
    if isinstance(v, bytes):
        return v.decode("utf-8")
    raise TypeError("config value %r is not JSON" % (v,))


class UcmGoStore(UcmKVStoreBaseV1):
    """UCM-Go as a UCM store.

    config is the dict UCM's connector hands its store (storage_backends, block_size,
    shard_size, tensor_size or tensor_size_list, device_id, io_direct, posix_io_engine, ...,
    plus UCM-Go's keys: docs/connector.md), or {"config_file": path} / {} (UCM_CONFIG_FILE) for
    a whole UCM YAML file. Every process configured with the same storage_backends opens its own
    instance there and sees the blocks of the others; a config without shard and tensor sizes
    (UCM's scheduler) gives a lookup-only store.
    """

    def __init__(self, config: Dict[str, object]) -> None:
        super().__init__(config)
        self._lib = _lib.get()
        cfg = dict(config or {})
        path = cfg.pop("config_file", None)
        # ensure_ascii=False: a character outside the BMP (an emoji in a path) goes over as
        # UTF-8, not as a surrogate-pair escape. UCM's variables are read from os.environ as
        # it is now (_lib.environment), not as the process started.
        text = path if path else (json.dumps(cfg, default=_jsonable, ensure_ascii=False) if cfg else "")
        h = self._lib.ucmgo_open_env(text.encode("utf-8", "surrogateescape"), _lib.environment())
        if h <= 0:
            raise UcmGoError(h, _lib.last_error())
        self._h = h
        self._h64 = ctypes.c_int64(h)  # for the fast entry points
        self._fast = _lib.fast()
        self._layout = self.stats()
        self.shard_size = int(self._layout["layout"]["ShardBytes"])
        self.shards = int(self._layout["layout"]["Shards"])
        self.tensor_sizes = [int(n) for n in (self._layout.get("tensors") or [])]

    # -- plumbing ------------------------------------------------------------------------------

    def _check(self, status: int) -> None:
        if status < 0:
            raise UcmGoError(status, _lib.last_error())

    def close(self) -> None:
        """Waits for the store's tasks and closes it. Idempotent."""
        h, self._h = getattr(self, "_h", 0), 0
        self._h64 = ctypes.c_int64(0)
        if h:
            self._check(self._lib.ucmgo_close(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finalizer must not raise
            pass

    def cc_store(self) -> int:
        """The native store handle (an int64 for libucmgo.so's C calls)."""
        return self._h

    def stats(self) -> dict:
        """The store's state: instance, layout, tensors, io_engine, and counters under "stats"."""
        n = self._lib.ucmgo_stats(self._h, None, 0)
        self._check(n)
        while True:
            # The counters move between the calls: a text that grew past the buffer (its
            # length returned is the buffer's or more) is asked for again, with room to spare.
            size = n + 1 + 256
            buf = ctypes.create_string_buffer(size)
            n = self._lib.ucmgo_stats(self._h, buf, size)
            self._check(n)
            if n < size:
                return json.loads(buf.value.decode("utf-8"))

    # -- lookups -------------------------------------------------------------------------------

    def lookup(self, block_ids: List[bytes]) -> List[bool]:
        n = len(block_ids)
        ids = _ids(block_ids)
        found = (ctypes.c_uint8 * max(n, 1))()
        self._check(self._lib.ucmgo_lookup(self._h, ids, n, found))
        return [bool(found[i]) for i in range(n)]

    def lookup_on_prefix(self, block_ids: List[bytes]) -> int:
        idx = ctypes.c_int64(-1)
        self._check(self._lib.ucmgo_lookup_on_prefix(self._h, _ids(block_ids), len(block_ids), ctypes.byref(idx)))
        return idx.value

    def prefetch(self, block_ids: List[bytes]) -> None:
        self._check(self._lib.ucmgo_prefetch(self._h, _ids(block_ids), len(block_ids)))

    # -- transfers -----------------------------------------------------------------------------

    def _shards(self, shard_index, n):
        if n and len(shard_index) == 0:
            # UCM's whole-block form (PcStore's): no shard list, each row covers its block.
            return array.array("q", [_WHOLE]) * n
        if len(shard_index) != n:
            raise UcmGoError(_lib.EPARAM, "%d block ids but %d shard indexes" % (n, len(shard_index)))
        try:
            try:
                return array.array("q", shard_index)  # ints, numpy ints or an int64 array
            except TypeError:
                return array.array("q", [int(s) for s in shard_index])
        except OverflowError as e:
            raise UcmGoError(_lib.EPARAM, "shard index out of range: %s" % e) from None

    def _addr_table(self, addrs, n):
        """Returns (table, per_block) for an address table, a list of lists of ints or a numpy
        array of shape (n, k): table is the n × k addresses as bytes (ctypes passes a bytes
        object's buffer; the library copies what it keeps), or None for no blocks."""
        if _np is not None and isinstance(addrs, _np.ndarray):
            shape = addrs.shape
            if addrs.dtype is _U64 and len(shape) == 2 and shape[0] == n and n:
                # The connector's own case, a slice of its uint64 table per layer: one copy
                # of n × k words, no numpy object made.
                return addrs.tobytes(), shape[1]
            table = _np.ascontiguousarray(addrs, dtype=_np.uint64)
            if table.ndim == 1:
                table = table.reshape(n, -1) if n else table.reshape(0, 0)
            if table.ndim != 2 or table.shape[0] != n:
                raise UcmGoError(_lib.EPARAM, "address table of shape %s for %d blocks" % (addrs.shape, n))
            return (table.tobytes(), table.shape[1]) if n else (None, 0)
        rows = addrs if isinstance(addrs, list) else list(addrs)
        if len(rows) != n:
            raise UcmGoError(_lib.EPARAM, "%d address lists for %d blocks" % (len(rows), n))
        if not n:
            return None, 0
        k = len(rows[0])
        if len(set(map(len, rows))) == 1:
            try:  # every address at C speed; a bad one is named by the loop below
                return array.array("Q", _chain.from_iterable(rows)).tobytes(), k
            except (OverflowError, TypeError):
                pass
        flat = array.array("Q")
        for i, row in enumerate(rows):
            if len(row) != k:
                raise UcmGoError(_lib.EPARAM, "block at position %d: %d addresses, block 0 has %d" % (i, len(row), k))
            try:
                flat.extend(int(a) for a in row)
            except (OverflowError, TypeError, ValueError) as e:  # ValueError: int("x")
                raise UcmGoError(_lib.EPARAM, "block at position %d: bad address: %s" % (i, e)) from None
        return flat.tobytes(), k

    def _transfer(self, load: bool, block_ids, shard_index, addrs, prerequisite=0, tensors=None):
        n = len(block_ids)
        ids = _ids(block_ids)
        shards = shard_index if isinstance(shard_index, array.array) else self._shards(shard_index, n)
        shards = shards.tobytes() if n else None
        table, k = self._addr_table(addrs, n)
        if 0 < n <= _SMALL and k <= _SMALL:
            # A small call through the fast entry points (_lib.Fast: every argument a ctypes
            # object or bytes), which return the task handle as a TaskHandle for wait.
            f = self._fast
            if load:
                h = f.ucmgo_load(self._h64, ids, shards, _SIZES[n], table, _SIZES[k])
            else:
                ev = ctypes.c_uint64(int(prerequisite)) if prerequisite else _NO_EVENT
                h = f.ucmgo_dump(self._h64, ids, shards, _SIZES[n], table, _SIZES[k], ev)
            t = h.value
            if t < 0:
                raise UcmGoError(t, _lib.last_error())
            return UcmGoTask(t, n, tensors, h)
        if load:
            t = self._lib.ucmgo_load(self._h, ids, shards, n, table, k)
        else:
            t = self._lib.ucmgo_dump(self._h, ids, shards, n, table, k, int(prerequisite or 0))
        if t < 0:
            raise UcmGoError(t, _lib.last_error())
        return UcmGoTask(t, n, tensors)

    def load_data(self, block_ids: List[bytes], shard_index: List[int], dst_addr) -> UcmGoTask:
        """Loads shard shard_index[i] of block i into the host addresses dst_addr[i] (one per
        tensor, or one for the whole shard). An empty shard_index (or -1 for a block) loads
        whole blocks: one address per tensor of every shard, one per shard, or one."""
        return self._transfer(True, block_ids, shard_index, dst_addr)

    def dump_data(self, block_ids: List[bytes], shard_index: List[int], src_addr, prerequisite_handle: int = 0) -> UcmGoTask:
        """Stores shard shard_index[i] of block i from the host addresses src_addr[i].
        prerequisite_handle (a device event in UCM) has nothing to wait for on host memory."""
        return self._transfer(False, block_ids, shard_index, src_addr, prerequisite_handle)

    def _row_sizes(self, whole: bool, k: int):
        """The bytes each of k tensors of a block's row must have: for a shard, one tensor (the
        shard) or one per configured tensor; for the whole block, one (the block), one per
        shard, or one per tensor of every shard, shard after shard. None when k is none of
        those."""
        t, shards = self.tensor_sizes, self.shards
        if k == 1:
            return [self.shard_size * shards if whole else self.shard_size]
        if not whole and k == len(t):
            return list(t)
        if whole and t and k == shards * len(t):
            return list(t) * shards
        if whole and k == shards:
            return [self.shard_size] * shards
        return None

    def _forms(self, whole: bool) -> str:
        t = self.tensor_sizes
        if whole:
            return "1 (the whole block, %d bytes), %d (one per shard, %d bytes each) or %d (one per tensor of every shard, sizes %s)" % (
                self.shard_size * self.shards, self.shards, self.shard_size, self.shards * len(t), t)
        return "1 (the whole shard, %d bytes) or %d (one per tensor, sizes %s)" % (self.shard_size, len(t), t)

    def _tensor_addrs(self, tensors, shards):
        """Addresses of CPU tensors, checked: contiguous, on the CPU, of the configured sizes
        for the row's form (a shard, or the whole block where shards[i] is -1)."""
        rows = []
        for i, row in enumerate(tensors):
            whole = i < len(shards) and shards[i] == _WHOLE
            want = self._row_sizes(whole, len(row))
            if want is None:
                raise UcmGoError(_lib.EPARAM, "block at position %d: %d tensors for %s; want %s" % (
                    i, len(row), "the whole block" if whole else "shard %d" % shards[i] if i < len(shards) else "a shard", self._forms(whole)))
            out = []
            for j, t in enumerate(row):
                cpu = getattr(t, "is_cpu", None)  # a torch tensor's: cheaper than device.type
                dev = "cpu" if cpu else getattr(getattr(t, "device", None), "type", "cpu")
                if dev != "cpu":
                    raise UcmGoError(_lib.EPARAM, "block at position %d, tensor %d: on %s; UCM-Go moves host memory (CPU tensors)" % (i, j, dev))
                if not t.is_contiguous():
                    raise UcmGoError(_lib.EPARAM, "block at position %d, tensor %d: not contiguous" % (i, j))
                nbytes = t.numel() * t.element_size()
                if nbytes != want[j]:
                    raise UcmGoError(_lib.EPARAM, "block at position %d, tensor %d: %d bytes, want %d (%d tensors: %s)" % (
                        i, j, nbytes, want[j], len(row), self._forms(whole)))
                out.append(t.data_ptr())
            rows.append(out)
        return rows

    def load(self, block_ids: List[bytes], shard_index: List[int], dst_tensor) -> UcmGoTask:
        """Loads into CPU tensors: dst_tensor[i][j] is tensor j of block i's shard. An empty
        shard_index (or -1 for a block) loads whole blocks (UCM's PcStore form): each row is one
        tensor per tensor of every shard (one per layer with tensor_size), one per shard, or one
        for the block, in order."""
        shards = self._shards(shard_index, len(block_ids))
        return self._transfer(True, block_ids, shards, self._tensor_addrs(dst_tensor, shards), tensors=dst_tensor)

    def dump(self, block_ids: List[bytes], shard_index: List[int], src_tensor) -> UcmGoTask:
        """Stores from CPU tensors: src_tensor[i][j] is tensor j of block i's shard; an empty
        shard_index dumps whole blocks, as load."""
        shards = self._shards(shard_index, len(block_ids))
        return self._transfer(False, block_ids, shards, self._tensor_addrs(src_tensor, shards), tensors=src_tensor)

    def wait(self, task: UcmGoTask) -> None:
        """Blocks until the task is done; raises UcmGoError when a block failed (task.failed says
        which). Consumes the task, as UCM's stores do: a second wait raises (ENOOBJ)."""
        n = task.blocks
        if task._handle is not None:  # a small task from the fast entry points
            mask = _MASKS[n]()
            status = self._fast.ucmgo_wait(self._h64, task._handle, mask, _SIZES[n])
        else:
            mask = (ctypes.c_uint8 * max(n, 1))()
            status = self._lib.ucmgo_wait(self._h, task.task_id, mask, n)
        task._keep = None
        if status == 0:
            task.failed = [False] * n
            return
        if status != _lib.ENOOBJ or task.failed is None:
            task.failed = [b != 0 for b in bytes(mask)[:n]]
        self._check(status)

    def check(self, task: UcmGoTask) -> bool:
        """True once the task has finished, successfully or not (wait then reports which)."""
        done = ctypes.c_int32(0)
        status = self._lib.ucmgo_check(self._h, task.task_id, ctypes.byref(done))
        if status < 0 and not done.value:
            self._check(status)
        return bool(done.value)

    # -- V0 ------------------------------------------------------------------------------------

    def create(self, block_ids: List[bytes]) -> List[int]:
        """Reserves blocks for a V0 dump: one status per block (0, or EDUPLICATE when stored)."""
        n = len(block_ids)
        res = (ctypes.c_int32 * max(n, 1))()
        self._check(self._lib.ucmgo_create(self._h, _ids(block_ids), n, res))
        return [res[i] for i in range(n)]

    def commit(self, block_ids: List[bytes], is_success: bool) -> None:
        """Publishes (is_success) or discards blocks reserved by create."""
        self._check(self._lib.ucmgo_commit(self._h, _ids(block_ids), len(block_ids), 1 if is_success else 0))
