"""Worker processes of test_pipelines.py (spawned: ucmgo is imported inside them)."""

import sys
import traceback
from pathlib import Path

from helpers import Slab, expected

PYDIR = str(Path(__file__).resolve().parents[1])


def cache_empty_worker(config, rank, ids, block, barrier, q):
    """UCM's cache_on_empty_mp_test in small: every rank opens a Cache|Empty store of one
    unique_id; rank 0 dumps, then every rank loads the blocks and checks every byte."""
    try:
        sys.path.insert(0, PYDIR)
        from ucmgo import UcmGoStore

        with UcmGoStore(dict(config, device_id=rank)) as store:
            slab = Slab(len(ids) * block)
            if rank == 0:
                for i, bid in enumerate(ids):
                    slab.write(i * block, expected(bid, 0, block))
                store.wait(store.dump_data(ids, [0] * len(ids), [[slab.base + i * block] for i in range(len(ids))]))
                assert all(store.lookup(ids)), "rank 0 misses its own blocks after wait"
            barrier.wait()
            # As UCM's script does: load at once, with no lookup first; rank 0's blocks are
            # visible to every process as soon as its wait returned.
            out = Slab(len(ids) * block)
            task = store.load_data(ids, [0] * len(ids), [[out.base + i * block] for i in range(len(ids))])
            store.wait(task)
            for i, bid in enumerate(ids):
                assert out.read(i * block, block) == expected(bid, 0, block), "rank %d: block %d differs" % (rank, i)
            q.put((rank, "ok", store.stats()["instance"]))
    except Exception:  # noqa: BLE001 - reported to the test
        q.put((rank, traceback.format_exc(), ""))
