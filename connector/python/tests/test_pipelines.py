"""UCM's configuration keys, and the Empty and Cache|Empty store pipelines, through the package."""

import multiprocessing
import os
import secrets
from pathlib import Path

import pytest

import pipeline_workers
import ucmgo
from helpers import BLOCK, K, SHARD, V, Slab, expected, random_ids
from ucmgo import UcmGoError, UcmGoStore

REPO = Path(__file__).resolve().parents[3]
SHM = Path("/dev/shm/ucmgo")


def ucm_e2e_configs(backend):
    """The store configurations of UCM's store e2e scripts (ucm/store/test/e2e), keys and values
    as UCM writes them, sizes aside."""
    uid = secrets.token_hex(8)
    return {
        "posixstore_aio_test": {"store_pipeline": "Posix", "posix_io_engine": "aio", "storage_backends": backend,
                                "tensor_size": SHARD, "shard_size": SHARD, "block_size": BLOCK, "device_id": 0},
        "posixstore_gc_test": {"store_pipeline": "Posix", "storage_backends": [backend], "tensor_size": BLOCK,
                               "shard_size": BLOCK, "block_size": BLOCK, "posix_io_engine": "psync",
                               "posix_data_trans_concurrency": 8, "posix_lookup_concurrency": 8, "io_direct": False,
                               "device_id": -1, "posix_gc_enable": True, "posix_capacity_gb": 60,
                               "posix_gc_trigger_threshold_ratio": 0.7, "posix_gc_recycle_percent": 0.1,
                               "posix_gc_concurrency": 16, "posix_gc_check_interval_sec": 10},
        "cache_on_posix_test": {"store_pipeline": "Cache|Posix", "storage_backends": backend, "unique_id": uid,
                                "timeout_ms": 10000, "tensor_size": SHARD, "shard_size": BLOCK, "block_size": BLOCK,
                                "share_buffer_enable": True, "waiting_queue_depth": 16, "running_queue_depth": 1024,
                                "io_direct": True, "posix_data_trans_concurrency": 32, "posix_lookup_concurrency": 32,
                                "device_id": 1, "cache_buffer_capacity_gb": 1},
        "cache_on_empty_test": {"store_pipeline": "Cache|Empty", "unique_id": uid, "timeout_ms": 10000,
                                "tensor_size": SHARD, "shard_size": BLOCK, "block_size": BLOCK,
                                "share_buffer_enable": True, "waiting_queue_depth": 16, "running_queue_depth": 1024,
                                "device_id": 1},
        "cache_variable_length_tensor_test": {"store_pipeline": "Cache|Empty", "unique_id": uid,
                                              "tensor_size_list": [K, V, SHARD], "shard_size": 2 * SHARD,
                                              "block_size": 8 * SHARD, "share_buffer_enable": True,
                                              "cache_buffer_capacity_gb": 1, "device_id": 2},
        "ds3fs_test": {"storage_backends": backend, "device_id": 0, "tensor_size": BLOCK, "shard_size": BLOCK,
                       "block_size": BLOCK, "io_direct": True, "stream_number": 32},
        "pcstore_embed_v1": {"storage_backends": [backend], "block_size": BLOCK, "device_id": 3,
                             "tensor_size": BLOCK, "unique_id": uid},
        # UCM's vLLM connector's worker form, and its sparse/blend examples' use_direct.
        "vllm_worker": {"storage_backends": [backend], "unique_id": uid, "device_id": 4, "tensor_size_list": [K, V],
                        "shard_size": SHARD, "block_size": BLOCK, "local_rank_size": 1, "cpu_affinity_cores": [0, 1],
                        "share_buffer_enable": False, "posix_gc_enable": False, "use_direct": False,
                        "posix_open_concurrency": 32, "posix_commit_concurrency": 4,
                        "posix_gc_max_recycle_count_per_shard": 50000, "posix_gc_shard_sample_ratio": 0.1,
                        "data_dir_shard_bytes": 3, "cache_stream_number": 4},
    }


@pytest.mark.parametrize("script", sorted(ucm_e2e_configs("/x")))
def test_ucm_keys_accepted(backend, script):
    """Every configuration UCM's e2e scripts (and its connector and examples) pass opens."""
    config = ucm_e2e_configs(backend)[script]
    with UcmGoStore(config) as store:
        assert store.lookup(random_ids(2)) == [False, False]


def test_ucm_key_typo_refused(backend):
    """A typo is refused naming the key and the key it resembles."""
    with pytest.raises(UcmGoError) as err:
        UcmGoStore({"storage_backends": backend, "device_id": 0, "tensor_size": BLOCK, "shard_size": BLOCK,
                    "block_size": BLOCK, "posix_lookup_concurency": 16})
    assert err.value.status == ucmgo.EPARAM
    assert "posix_lookup_concurency" in str(err.value) and 'did you mean "posix_lookup_concurrency"' in str(err.value)


def whole(n):
    slab = Slab(n * BLOCK)
    return slab, [[slab.base + i * BLOCK] for i in range(n)]


def test_empty_pipeline():
    """UCM's Empty store: a dump completes and stores nothing, lookups are false, a load fails
    every block as a miss (ENOOBJ) and leaves the memory alone; nothing is left on close."""
    config = {"store_pipeline": "Empty", "share_buffer_enable": True, "tensor_size": BLOCK, "shard_size": BLOCK,
              "block_size": BLOCK, "device_id": 0}
    before = set(os.listdir(SHM)) if SHM.exists() else set()
    ids = random_ids(4)
    with UcmGoStore(config) as store, UcmGoStore({"store_pipeline": "Empty"}) as scheduler:
        slab, addrs = whole(4)
        for i, bid in enumerate(ids):
            slab.write(i * BLOCK, expected(bid, 0, BLOCK))
        task = store.dump_data(ids, [0] * 4, addrs)
        store.wait(task)
        assert task.failed == [False] * 4
        assert store.lookup(ids) == [False] * 4 and scheduler.lookup(ids) == [False] * 4
        assert store.lookup_on_prefix(ids) == -1 and scheduler.lookup_on_prefix(ids) == -1
        out, addrs = whole(4)
        out.write(0, b"\x5a")
        task = store.load_data(ids, [0] * 4, addrs)
        with pytest.raises(UcmGoError) as err:
            store.wait(task)
        assert err.value.status == ucmgo.ENOOBJ and "Empty store keeps nothing" in str(err.value)
        assert task.failed == [True] * 4
        assert out.read(0, 1) == b"\x5a"
    after = set(os.listdir(SHM)) if SHM.exists() else set()
    assert after <= before, after - before


def test_cache_empty_shared_across_processes():
    """UCM's cache_on_empty_mp_test in small: three processes open Cache|Empty with one
    unique_id and share_buffer_enable; rank 0 dumps, every rank loads every byte; the cache
    lives in /dev/shm/ucmgo/cache-<unique_id>, and the last process to close removes it."""
    uid = secrets.token_hex(8)
    config = {"store_pipeline": "Cache|Empty", "unique_id": uid, "tensor_size": BLOCK // 4, "shard_size": BLOCK,
              "block_size": BLOCK, "share_buffer_enable": True, "cache_buffer_capacity_gb": 1}
    ids = random_ids(16)
    ctx = multiprocessing.get_context("spawn")
    barrier, q = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=pipeline_workers.cache_empty_worker, args=(config, r, ids, BLOCK, barrier, q))
             for r in range(3)]
    for p in procs:
        p.start()
    results = [q.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(60)
    for rank, outcome, _ in results:
        assert outcome == "ok", "rank %d: %s" % (rank, outcome)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert len({inst for _, _, inst in results}) == 3
    assert not (SHM / ("cache-" + uid)).exists()
    assert not (SHM / ("cache-" + uid + ".lock")).exists()


def test_cache_empty_in_one_process():
    """UCM's cache_on_empty_test in small: a worker and the scheduler of one unique_id in one
    process are two instances of the shared cache; the scheduler finds what the worker dumped,
    and the worker loads every byte."""
    uid = secrets.token_hex(8)
    config = {"store_pipeline": "Cache|Empty", "unique_id": uid, "timeout_ms": 10000, "tensor_size": BLOCK // 4,
              "shard_size": BLOCK, "block_size": BLOCK, "share_buffer_enable": True, "waiting_queue_depth": 16,
              "running_queue_depth": 1024}
    ids = random_ids(8)
    with UcmGoStore(dict(config, device_id=1)) as worker, UcmGoStore(config) as scheduler:
        assert not any(scheduler.lookup(ids)) and scheduler.lookup_on_prefix(ids) == -1
        slab, addrs = whole(8)
        for i, bid in enumerate(ids):
            slab.write(i * BLOCK, expected(bid, 0, BLOCK))
        worker.wait(worker.dump_data(ids, [0] * 8, addrs))
        assert all(worker.lookup(ids))
        # Another store of the unique_id finds them as soon as the wait returned.
        assert scheduler.lookup_on_prefix(ids) == len(ids) - 1, scheduler.lookup(ids)
        out, addrs = whole(8)
        worker.wait(worker.load_data(ids, [0] * 8, addrs))
        for i, bid in enumerate(ids):
            assert out.read(i * BLOCK, BLOCK) == expected(bid, 0, BLOCK)
        assert (SHM / ("cache-" + uid)).is_dir()
    assert not (SHM / ("cache-" + uid)).exists()
