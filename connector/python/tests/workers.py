"""Worker processes the tests spawn (this module imports ucmgo only inside them, so that a
child can put UCM's stand-in package on sys.path first)."""

import sys
import time
import traceback
from pathlib import Path

from helpers import LAYERS, SHARD, K, Slab, expected, layerwise_config

PYDIR = str(Path(__file__).resolve().parents[1])


def _wait_visible(store, ids, timeout=60):
    deadline = time.time() + timeout
    while not all(store.lookup(ids)):
        if time.time() > deadline:
            raise AssertionError("blocks not visible after %ds: %s" % (timeout, store.lookup(ids)))
        time.sleep(0.02)


def _load_all(store, ids):
    slab = Slab(len(ids) * SHARD)
    for layer in range(LAYERS):
        addrs = [[slab.base + i * SHARD, slab.base + i * SHARD + K] for i in range(len(ids))]
        store.wait(store.load_data(ids, [layer] * len(ids), addrs))
        for i, bid in enumerate(ids):
            if slab.read(i * SHARD, SHARD) != expected(bid, layer, SHARD):
                raise AssertionError("rank's load of block %d layer %d differs" % (i, layer))


def _dump_all(store, ids):
    slab = Slab(len(ids) * SHARD)
    for layer in range(LAYERS):
        for i, bid in enumerate(ids):
            slab.write(i * SHARD, expected(bid, layer, SHARD))
        addrs = [[slab.base + i * SHARD, slab.base + i * SHARD + K] for i in range(len(ids))]
        store.wait(store.dump_data(ids, [layer] * len(ids), addrs))


def tp_rank(backend, rank, own, shared, q):
    """A tensor-parallel worker: dumps its own blocks (non-MLA: each rank its own ids) and, as
    rank 0 with MLA, the shared ones; every rank then loads its own and the shared blocks."""
    try:
        sys.path.insert(0, PYDIR)
        from ucmgo import UcmGoStore

        with UcmGoStore(layerwise_config(backend, device_id=rank)) as store:
            _dump_all(store, own)
            if rank == 0:
                _dump_all(store, shared)
            _load_all(store, own)
            _wait_visible(store, shared)
            _load_all(store, shared)
            q.put((rank, "ok", store.stats()["instance"]))
    except Exception:  # noqa: BLE001 - reported to the test
        q.put((rank, traceback.format_exc(), ""))


def factory_child(standin, backend, q):
    """With a stand-in of UCM's package on sys.path: UCM's factory creates UcmGoStore by module
    path and by registered name, and it is an instance of UCM's base class."""
    try:
        sys.path.insert(0, standin)
        sys.path.insert(0, PYDIR)
        import ucmgo
        from ucm.store.factory_v1 import UcmConnectorFactoryV1
        from ucm.store.ucmstore_v1 import UcmKVStoreBaseV1

        by_path = UcmConnectorFactoryV1.create_connector("UcmGoStore", layerwise_config(backend), "ucmgo")
        ok = ucmgo.HAVE_UCM and isinstance(by_path, UcmKVStoreBaseV1)
        by_path.close()
        by_name = UcmConnectorFactoryV1.create_connector("UcmGoStore", layerwise_config(backend))
        ok = ok and isinstance(by_name, ucmgo.UcmGoStore)
        by_name.close()
        q.put(ok)
    except Exception:  # noqa: BLE001 - reported to the test
        q.put(traceback.format_exc())
