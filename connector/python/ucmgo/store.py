"""UcmGoStore: UCM's store interface (UcmKVStoreBaseV1) over libucmgo.so."""

import array
import ctypes
import json
from abc import ABC, abstractmethod
from typing import Dict, List, Sequence

from . import _lib

try:  # numpy is optional: address tables may be numpy arrays, results stay lists
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only without numpy
    _np = None

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

    __slots__ = ("task_id", "blocks", "failed", "_keep")

    def __init__(self, task_id: int, blocks: int, keep):
        self.task_id = task_id
        self.blocks = blocks
        self.failed = None
        self._keep = keep  # the address table and tensors stay alive until wait

    def __repr__(self):
        return "UcmGoTask(%d, blocks=%d)" % (self.task_id, self.blocks)


def _ids(block_ids: Sequence[bytes]):
    """Joins the ids into one buffer, checking each is 16 raw bytes."""
    if not block_ids:
        return None  # ctypes passes a bytes object's buffer
    try:  # the common case at C speed: a per-task cost of the connector's hot path
        joined = b"".join(block_ids)
        if len(joined) == _lib.ID_BYTES * len(block_ids) and set(map(len, block_ids)) == {_lib.ID_BYTES}:
            return joined
    except TypeError:
        pass
    for i, b in enumerate(block_ids):  # name the first bad id
        if not isinstance(b, (bytes, bytearray)) or len(b) != _lib.ID_BYTES:
            raise UcmGoError(
                _lib.EPARAM,
                "block id at position %d: want %d raw bytes, got %r" % (i, _lib.ID_BYTES, type(b).__name__ if not isinstance(b, (bytes, bytearray)) else len(b)),
            )
    raise UcmGoError(_lib.EPARAM, "block ids: want %d raw bytes each" % _lib.ID_BYTES)  # not reached


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
        text = path if path else (json.dumps(cfg, default=_jsonable) if cfg else "")
        h = self._lib.ucmgo_open(text.encode("utf-8"))
        if h <= 0:
            raise UcmGoError(h, _lib.last_error())
        self._h = h
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
        buf = ctypes.create_string_buffer(n + 1)
        n = self._lib.ucmgo_stats(self._h, buf, n + 1)
        self._check(n)
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
        """Returns (buffer, per_block, keep) for an address table: a list of lists of ints or a
        numpy array of shape (n, k)."""
        if _np is not None and isinstance(addrs, _np.ndarray):
            table = _np.ascontiguousarray(addrs, dtype=_np.uint64)
            if table.ndim == 1:
                table = table.reshape(n, -1) if n else table.reshape(0, 0)
            if table.ndim != 2 or table.shape[0] != n:
                raise UcmGoError(_lib.EPARAM, "address table of shape %s for %d blocks" % (addrs.shape, n))
            return ctypes.c_void_p(table.ctypes.data) if n else None, table.shape[1] if n else 0, table
        rows = list(addrs)
        if len(rows) != n:
            raise UcmGoError(_lib.EPARAM, "%d address lists for %d blocks" % (len(rows), n))
        k = len(rows[0]) if n else 0
        flat = array.array("Q")
        for i, row in enumerate(rows):
            if len(row) != k:
                raise UcmGoError(_lib.EPARAM, "block at position %d: %d addresses, block 0 has %d" % (i, len(row), k))
            try:
                flat.extend(int(a) for a in row)
            except (OverflowError, TypeError) as e:
                raise UcmGoError(_lib.EPARAM, "block at position %d: bad address: %s" % (i, e)) from None
        if not n:
            return None, 0, flat
        ptr, _ = flat.buffer_info()
        return ctypes.c_void_p(ptr), k, flat

    def _transfer(self, load: bool, block_ids, shard_index, addrs, prerequisite=0, tensors=None):
        n = len(block_ids)
        ids = _ids(block_ids)
        shards = self._shards(shard_index, n)
        table, k, keep = self._addr_table(addrs, n)
        sptr = ctypes.c_void_p(shards.buffer_info()[0]) if n else None
        if load:
            t = self._lib.ucmgo_load(self._h, ids, sptr, n, table, k)
        else:
            t = self._lib.ucmgo_dump(self._h, ids, sptr, n, table, k, int(prerequisite or 0))
        self._check(t)
        return UcmGoTask(t, n, (ids, shards, keep, tensors))

    def load_data(self, block_ids: List[bytes], shard_index: List[int], dst_addr) -> UcmGoTask:
        """Loads shard shard_index[i] of block i into the host addresses dst_addr[i] (one per
        tensor, or one for the whole shard)."""
        return self._transfer(True, block_ids, shard_index, dst_addr)

    def dump_data(self, block_ids: List[bytes], shard_index: List[int], src_addr, prerequisite_handle: int = 0) -> UcmGoTask:
        """Stores shard shard_index[i] of block i from the host addresses src_addr[i].
        prerequisite_handle (a device event in UCM) has nothing to wait for on host memory."""
        return self._transfer(False, block_ids, shard_index, src_addr, prerequisite_handle)

    def _tensor_addrs(self, tensors):
        """Addresses of CPU tensors, checked: contiguous, on the CPU, of the configured sizes."""
        rows = []
        for i, row in enumerate(tensors):
            out = []
            for j, t in enumerate(row):
                dev = getattr(getattr(t, "device", None), "type", "cpu")
                if dev != "cpu":
                    raise UcmGoError(_lib.EPARAM, "block at position %d, tensor %d: on %s; UCM-Go moves host memory (CPU tensors)" % (i, j, dev))
                if not t.is_contiguous():
                    raise UcmGoError(_lib.EPARAM, "block at position %d, tensor %d: not contiguous" % (i, j))
                nbytes = t.numel() * t.element_size()
                want = self.shard_size if len(row) == 1 else (self.tensor_sizes[j] if j < len(self.tensor_sizes) else -1)
                if nbytes != want:
                    raise UcmGoError(_lib.EPARAM, "block at position %d, tensor %d: %d bytes, want %d" % (i, j, nbytes, want))
                out.append(t.data_ptr())
            rows.append(out)
        return rows

    def load(self, block_ids: List[bytes], shard_index: List[int], dst_tensor) -> UcmGoTask:
        """Loads into CPU tensors: dst_tensor[i][j] is tensor j of block i's shard."""
        return self._transfer(True, block_ids, shard_index, self._tensor_addrs(dst_tensor), tensors=dst_tensor)

    def dump(self, block_ids: List[bytes], shard_index: List[int], src_tensor) -> UcmGoTask:
        """Stores from CPU tensors: src_tensor[i][j] is tensor j of block i's shard."""
        return self._transfer(False, block_ids, shard_index, self._tensor_addrs(src_tensor), tensors=src_tensor)

    def wait(self, task: UcmGoTask) -> None:
        """Blocks until the task is done; raises UcmGoError when a block failed (task.failed says
        which). Consumes the task, as UCM's stores do: a second wait raises (ENOOBJ)."""
        mask = (ctypes.c_uint8 * max(task.blocks, 1))()
        status = self._lib.ucmgo_wait(self._h, task.task_id, mask, task.blocks)
        if status == 0:
            task.failed = [False] * task.blocks
        elif status != _lib.ENOOBJ or task.failed is None:
            task.failed = [b != 0 for b in bytes(mask)[: task.blocks]]
        task._keep = None
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
