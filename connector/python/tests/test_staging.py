"""Layer-wise dumps from unaligned host memory beyond the store's staging budget."""

import torch

from helpers import random_ids
from ucmgo import UcmGoStore


def test_layerwise_dump_beyond_staging_budget_waits(backend):
    """UCM's layer-wise shape (every layer submitted before any wait) from tensors one byte off
    any page boundary, whose layer runs together, and one alone, need more staging memory than
    max_staging_bytes: the runs wait for staging memory instead of failing, and every block is
    stored byte-exact."""
    io, layers, n = 8192, 16, 64
    budget = 2 * io * layers  # one layer's run of the 64 blocks needs 4 × io × layers
    store = UcmGoStore({"storage_backends": [backend], "block_size": io * layers, "device_id": 1,
                        "tensor_size": io, "max_staging_bytes": budget})
    try:
        ids = random_ids(n)
        raw = [[torch.randint(0, 256, (io + 1,), dtype=torch.uint8) for _ in range(layers)] for _ in range(n)]
        src = [[r[1:] for r in row] for row in raw]  # never 4 KiB-aligned: staged through bounce buffers
        assert all(t.data_ptr() % 4096 for row in src for t in row)
        tasks = [store.dump(ids, [s] * n, [[row[s]] for row in src]) for s in range(layers)]
        for task in tasks:
            store.wait(task)
        assert store.lookup(ids) == [True] * n
        dst = [[torch.zeros(io, dtype=torch.uint8) for _ in range(layers)] for _ in range(n)]
        for s in range(layers):
            store.wait(store.load(ids, [s] * n, [[row[s]] for row in dst]))
        for i in range(n):
            for s in range(layers):
                assert torch.equal(dst[i][s], src[i][s]), (i, s)
        stats = store.stats()["stats"]
        assert 0 < stats["StagingPeakBytes"] <= budget, stats["StagingPeakBytes"]
    finally:
        store.close()
