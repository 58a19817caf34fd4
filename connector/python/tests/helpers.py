"""Shared by the tests and the worker processes they spawn."""

import ctypes
import hashlib
import mmap
import os

K = V = 32 * 1024  # one layer's K and V of one block, bytes
LAYERS = 8
SHARD = K + V
BLOCK = SHARD * LAYERS


def layerwise_config(backend, device_id=0, **extra):
    """A worker's config as UCM's connector builds it for layer-wise transfers."""
    cfg = {"storage_backends": backend, "device_id": device_id, "unique_id": "engine-0",
           "tensor_size_list": [K, V], "shard_size": SHARD, "block_size": BLOCK,
           "io_direct": True, "local_rank_size": 1}
    cfg.update(extra)
    return cfg


def whole_config(backend, device_id=0, **extra):
    """Whole-block transfers: one shard per block, its tensors every layer's K and V."""
    cfg = {"storage_backends": backend, "device_id": device_id,
           "tensor_size_list": [K, V] * LAYERS, "shard_size": BLOCK, "block_size": BLOCK}
    cfg.update(extra)
    return cfg


def random_ids(n, salt=b""):
    seed = os.urandom(8) + salt
    return [hashlib.md5(seed + i.to_bytes(4, "little")).digest() for i in range(n)]


def expected(block_id, shard, n):
    """Bytes of a block's shard no other block or shard has."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(block_id + shard.to_bytes(2, "little") + counter.to_bytes(4, "little")).digest()
        counter += 1
    return bytes(out[:n])


HUGE = 2 << 20


class Slab:
    """Anonymous memory (mmap) aligned to 2 MiB and advised into transparent huge pages, as a
    connector's pinned host buffers are; huge=False: plain 4 KiB pages."""

    def __init__(self, size, huge=True):
        slack = HUGE if huge else 0
        self._map = mmap.mmap(-1, size + slack)
        raw = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self.off = (-raw) % HUGE if huge else 0
        if huge and hasattr(mmap, "MADV_HUGEPAGE"):
            self._map.madvise(mmap.MADV_HUGEPAGE)
        self.mm = memoryview(self._map)[self.off:self.off + size]
        self.size = size
        self.base = raw + self.off

    def write(self, off, data):
        self.mm[off:off + len(data)] = data

    def read(self, off, n):
        return bytes(self.mm[off:off + n])

    def zero(self):
        self.mm[:] = b"\0" * self.size
