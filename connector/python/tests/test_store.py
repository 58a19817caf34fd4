"""UcmGoStore through libucmgo.so: transfers, lookups, bad input, hashing, UCM's factory."""

import ctypes
import json
import multiprocessing
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ucmgo
import workers
from ucm_standin import UCM_STANDIN
from helpers import BLOCK, K, LAYERS, SHARD, V, Slab, expected, layerwise_config, random_ids, whole_config
from ucmgo import RequestHasher, UcmGoError, UcmGoStore

REPO = Path(__file__).resolve().parents[3]


def dump_layerwise(store, ids, slab):
    """Dumps every layer of ids from slab, one task per layer (UCM's save_kv_layer)."""
    for layer in range(LAYERS):
        for i, bid in enumerate(ids):
            slab.write(i * SHARD, expected(bid, layer, SHARD))
        addrs = [[slab.base + i * SHARD, slab.base + i * SHARD + K] for i in range(len(ids))]
        task = store.dump_data(ids, [layer] * len(ids), addrs)
        store.wait(task)
        assert task.failed == [False] * len(ids)


def test_layerwise_round_trip(backend):
    """Many random ids dumped layer by layer from aligned mmap buffers, loaded back layer by
    layer (with numpy address tables, one address per shard or per tensor), bytes compared."""
    n = 64
    with UcmGoStore(layerwise_config(backend)) as store:
        ids = random_ids(n)
        slab = Slab(n * SHARD)
        dump_layerwise(store, ids, slab)
        assert store.lookup(ids) == [True] * n
        for layer in range(LAYERS):
            slab.zero()
            if layer % 2:
                addrs = np.array([[slab.base + i * SHARD, slab.base + i * SHARD + K] for i in range(n)], dtype=np.uint64)
            else:
                addrs = np.array([[slab.base + i * SHARD] for i in range(n)], dtype=np.uint64)
            task = store.load_data(ids, [layer] * n, addrs)
            store.wait(task)
            for i, bid in enumerate(ids):
                assert slab.read(i * SHARD, SHARD) == expected(bid, layer, SHARD), (layer, i)
        st = store.stats()
        assert st["stats"]["LoadedShards"] == n * LAYERS and st["direct_io"] in (True, False)


def test_whole_block_round_trip_with_tensors(backend):
    """Whole blocks (one shard of every layer's K and V) from torch CPU tensors, each tensor
    its own allocation (staged), and from one contiguous bf16 tensor per block (in place)."""
    n = 16
    with UcmGoStore(whole_config(backend)) as store:
        ids = random_ids(n)
        src = []
        for bid in ids:
            raw = expected(bid, 0, BLOCK)
            src.append([torch.frombuffer(bytearray(raw[j * K:(j + 1) * K]), dtype=torch.bfloat16) for j in range(2 * LAYERS)])
        store.wait(store.dump(ids, [0] * n, src))
        dst = [[torch.zeros(K // 2, dtype=torch.bfloat16) for _ in range(2 * LAYERS)] for _ in range(n)]
        task = store.load(ids, [0] * n, dst)
        while not store.check(task):
            time.sleep(0.001)
        store.wait(task)
        for i, bid in enumerate(ids):
            got = b"".join(t.view(torch.uint8).numpy().tobytes() for t in dst[i])
            assert got == expected(bid, 0, BLOCK)
        # One tensor holding the whole shard.
        whole = [[torch.zeros(BLOCK // 2, dtype=torch.bfloat16)] for _ in range(n)]
        store.wait(store.load(ids, [0] * n, whole))
        assert all(whole[i][0].view(torch.uint8).numpy().tobytes() == expected(bid, 0, BLOCK) for i, bid in enumerate(ids))


def test_lookup_semantics(backend):
    """lookup is exact per block; lookup_on_prefix is the last index of the leading run."""
    with UcmGoStore(layerwise_config(backend)) as store:
        ids = random_ids(6)
        dump_layerwise(store, ids[:4], Slab(4 * SHARD))
        missing = random_ids(1)[0]
        assert store.lookup(ids) == [True] * 4 + [False] * 2
        assert store.lookup_on_prefix(ids) == 3
        assert store.lookup_on_prefix([missing] + ids) == -1
        assert store.lookup_on_prefix(ids[:2] + [missing] + ids[2:4]) == 1
        assert store.lookup([]) == [] and store.lookup_on_prefix([]) == -1
        store.prefetch(ids + [missing])


def test_v0_create_commit(backend):
    with UcmGoStore(whole_config(backend, tensor_size_list=[BLOCK])) as store:
        ids = random_ids(3)
        assert store.create(ids) == [0, 0, 0]
        slab = Slab(3 * BLOCK)
        for i, bid in enumerate(ids):
            slab.write(i * BLOCK, expected(bid, 0, BLOCK))
        store.wait(store.dump_data(ids, [0] * 3, [[slab.base + i * BLOCK] for i in range(3)]))
        assert store.lookup(ids) == [False] * 3
        store.commit(ids, True)
        assert store.lookup(ids) == [True] * 3
        assert store.create(ids[:1]) == [ucmgo.EDUPLICATE]


def expect_error(status, words, fn, *args):
    with pytest.raises(UcmGoError) as err:
        fn(*args)
    assert err.value.status == status, str(err.value)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_bad_input(backend):
    """Every bad call raises UcmGoError with UCM's status and a message naming the fault, and
    loses nothing stored."""
    store = UcmGoStore(layerwise_config(backend))
    ids = random_ids(2)
    slab = Slab(2 * SHARD)
    dump_layerwise(store, ids, slab)
    a = [[slab.base, slab.base + K], [slab.base + SHARD, slab.base + SHARD + K]]
    expect_error(ucmgo.EPARAM, ["position 1", "16 raw bytes"], store.lookup, [ids[0], b"short"])
    expect_error(ucmgo.EPARAM, ["position 0"], store.lookup, ["not bytes"])
    # Lengths that add up to 2 × 16 bytes are still named (the joined fast path checks each).
    expect_error(ucmgo.EPARAM, ["position 0", "16 raw bytes"], store.lookup, [ids[0][:15], ids[1] + b"x"])
    expect_error(ucmgo.EPARAM, ["shard index out of range"], store.load_data, ids, [2 ** 70, 0], a)
    expect_error(ucmgo.EPARAM, ["shard index 9"], store.load_data, ids, np.array([9, 0]), a)
    expect_error(ucmgo.EPARAM, ["shard index 8"], store.load_data, ids, [8, 0], a)
    expect_error(ucmgo.EPARAM, ["shard index -2"], store.load_data, ids, [-2, 0], a)
    # -1 is the whole block, which takes 1, 8 or 16 addresses: 2 is named as that form's fault.
    expect_error(ucmgo.EPARAM, ["position 0", "for the whole block: want 1, 8 (one per shard) or 16"], store.load_data, ids, [-1, 0], a)
    expect_error(ucmgo.EPARAM, ["2 block ids but 1 shard"], store.load_data, ids, [0], a)
    expect_error(ucmgo.EPARAM, ["address 0: null"], store.load_data, ids, [0, 0], [[0, slab.base + K], a[1]])
    expect_error(ucmgo.EPARAM, ["3 addresses per block"], store.dump_data, ids, [0, 0], [r + [slab.base] for r in a])
    expect_error(ucmgo.EDUPLICATE, ["positions 0 and 1"], store.dump_data, [ids[0], ids[0]], [1, 1], a)
    expect_error(ucmgo.EPARAM, ["tensor 0", "bytes"], store.load, ids[:1], [0], [[torch.zeros(10), torch.zeros(10)]])
    expect_error(ucmgo.EPARAM, ["not contiguous"], store.load, ids[:1], [0],
                 [[torch.zeros(K // 2, 2, dtype=torch.bfloat16).t(), torch.zeros(V // 2, dtype=torch.bfloat16)]])
    task = store.load_data(ids, np.array([0, 0], dtype=np.int32), a)  # numpy shard indexes
    store.wait(task)
    assert task.failed == [False, False]
    expect_error(ucmgo.ENOOBJ, ["already waited"], store.wait, task)
    # A miss fails its block alone.
    task = store.load_data([ids[0], random_ids(1)[0]], [0, 0], a)
    expect_error(ucmgo.ENOOBJ, ["not found"], store.wait, task)
    assert task.failed == [False, True]
    assert slab.read(0, SHARD) == expected(ids[0], 0, SHARD)
    expect_error(ucmgo.EPARAM, ["shard_sise"], UcmGoStore, {"storage_backends": backend, "shard_sise": 1})
    expect_error(ucmgo.EPARAM, ["device_id"], UcmGoStore, {"storage_backends": backend, "device_id": 0})
    store.close()
    expect_error(ucmgo.EPARAM, ["not open"], store.lookup, ids)
    store.close()  # idempotent
    with UcmGoStore(layerwise_config(backend)) as again:
        assert again.lookup(ids) == [True, True]


def test_small_calls_take_every_table_form(backend):
    """Calls of up to 32 blocks go through the package's fast entry points and larger ones
    through the declared ones: at 32 and 33 blocks, with the table as a strided numpy view,
    an int64 array, a 1-D array and lists, every byte loads; a bad table of each form still
    raises before anything starts, naming what is wrong."""
    n = 33
    with UcmGoStore(layerwise_config(backend)) as store:
        ids = random_ids(n)
        slab = Slab(n * SHARD)
        dump_layerwise(store, ids, slab)
        # Columns 0 and 2 of a wider table: not contiguous, so the fast path must copy it right.
        wide = np.array([[slab.base + i * SHARD, 0, slab.base + i * SHARD + K] for i in range(n)], dtype=np.uint64)
        forms = [
            lambda m: wide[:m, ::2],
            lambda m: wide[:m, ::2].astype(np.int64),
            lambda m: np.ascontiguousarray(wide[:m, ::2]).reshape(-1),
            lambda m: [[int(a) for a in row] for row in wide[:m, ::2]],
            lambda m: ((slab.base + i * SHARD,) for i in range(m)),  # one address per shard
        ]
        for m in (32, 33):
            for f, form in enumerate(forms):
                layer = (m + f) % LAYERS
                slab.zero()
                task = store.load_data(ids[:m], [layer] * m, form(m))
                store.wait(task)
                assert task.failed == [False] * m
                for i in range(m):
                    assert slab.read(i * SHARD, SHARD) == expected(ids[i], layer, SHARD), (m, f, i)
        a = wide[:2, ::2]
        expect_error(ucmgo.EPARAM, ["address table of shape (3, 2) for 2 blocks"], store.load_data, ids[:2], [0, 0], wide[:3, ::2])
        expect_error(ucmgo.EPARAM, ["address table of shape (2, 2, 1) for 2 blocks"], store.load_data, ids[:2], [0, 0], a.reshape(2, 2, 1))
        expect_error(ucmgo.EPARAM, ["3 address lists for 2 blocks"], store.load_data, ids[:2], [0, 0], a.tolist() + [[1, 2]])
        expect_error(ucmgo.EPARAM, ["block at position 1: 1 addresses, block 0 has 2"], store.load_data, ids[:2], [0, 0], [a.tolist()[0], [1]])
        expect_error(ucmgo.EPARAM, ["block at position 1: bad address"], store.load_data, ids[:2], [0, 0], [a.tolist()[0], [-1, 5]])
        expect_error(ucmgo.EPARAM, ["block at position 0: bad address"], store.dump_data, ids[:2], [0, 0], [["x", 5], [1, 2]])
        expect_error(ucmgo.EPARAM, ["2 block ids but 3 shard"], store.load_data, ids[:2], [0, 0, 0], a)
        expect_error(ucmgo.EPARAM, ["0 block ids but 1 shard"], store.load_data, [], [0], [])
        expect_error(ucmgo.EPARAM, ["40 addresses per block"], store.load_data, ids[:2], [0, 0], np.ones((2, 40), dtype=np.uint64))
        # A dump with UCM's prerequisite event (nothing to wait for on host memory) and a wait
        # on a small task after its store closed.
        store.wait(store.dump_data(ids[:2], [0, 0], a, prerequisite_handle=7))
        task = store.load_data(ids[:2], [0, 0], a)
        store.close()
        expect_error(ucmgo.EPARAM, [], store.wait, task)
        expect_error(ucmgo.EPARAM, ["not open"], store.load_data, ids[:2], [0, 0], a)


def test_request_hasher_matches_ucm_vectors():
    """RequestHasher gives UCM's ids: the vectors python3's pickle produced (the same ones the
    Go hasher is tested against), and the meta uses str(dtype) as UCM's connector renders it."""
    vec = json.loads((REPO / "connector" / "ucmhash" / "testdata" / "hasher" / "vectors.json").read_text())
    for c in vec["chains"]:
        h = RequestHasher(model=c["model"], tp_size=c["tp_size"], dtype=c["dtype"], rank_id=c["rank"])
        assert h.seed().hex() == c["seed"]
        ids = h.block_ids(c["tokens"], c["block_size"])
        assert [x.hex() for x in ids] == c["ids"]
        for fr in c["for_rank"]:
            hr = RequestHasher(model=c["model"], tp_size=c["tp_size"], dtype=c["dtype"], rank_id=fr["rank"])
            assert [x.hex() for x in h.for_rank(hr, ids, fr["rank"])] == fr["ids"]
    h = RequestHasher(model="Qwen/Qwen2.5-7B-Instruct", tp_size=1, dtype=torch.bfloat16)
    assert h.meta == "Qwen/Qwen2.5-7B-Instruct:1:torch.bfloat16:0"
    assert h.seed() != RequestHasher(model="Qwen/Qwen2.5-7B-Instruct", tp_size=1, dtype="bfloat16").seed()


def test_ucm_factory_registration(tmp_path, backend):
    """With UCM's package importable, UcmGoStore subclasses UCM's base class and UCM's factory
    creates it by module path and by registered name."""
    standin = tmp_path / "standin"
    for rel, text in UCM_STANDIN.items():
        (standin / rel).parent.mkdir(parents=True, exist_ok=True)
        (standin / rel).write_text(text)
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=workers.factory_child, args=(str(standin), backend, q))
    p.start()
    p.join(120)
    assert p.exitcode == 0 and q.get(timeout=5) is True


def test_tensor_parallel_workers_share_backends(backend):
    """Three worker processes configured with the same storage_backends, as vLLM's TP workers
    under UCM: each stores and loads its own blocks; with MLA rank 0 dumps and every rank loads
    the same blocks; the scheduler's store (block_size only) sees them. Nobody is refused."""
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    shared = random_ids(12, b"mla")
    procs = [ctx.Process(target=workers.tp_rank, args=(backend, r, random_ids(10, bytes([r])), shared, q)) for r in range(3)]
    for p in procs:
        p.start()
    with UcmGoStore({"storage_backends": backend, "block_size": BLOCK}) as scheduler:
        results = [q.get(timeout=180) for _ in procs]
        for p in procs:
            p.join(60)
        for rank, outcome, _ in results:
            assert outcome == "ok", "rank %d: %s" % (rank, outcome)
        assert len({inst for _, _, inst in results}) == 3
        deadline = time.time() + 30
        while scheduler.lookup_on_prefix(shared) != len(shared) - 1:
            assert time.time() < deadline, scheduler.lookup(shared)
            time.sleep(0.05)
        assert scheduler.stats()["scheduler"] is True
        expect_error(ucmgo.EPARAM, ["only looks up"], scheduler.load_data, shared[:1], [0], [[1]])


def test_stats_text_that_grows_between_calls(backend):
    """stats() asks for the length, then for the text: counters that gained digits in between
    make the text longer than the buffer, which must be asked for again, not decoded cut."""
    with UcmGoStore(whole_config(backend)) as store:
        real = store._lib

        class Growing:
            """The library, with stats text 300 bytes longer on the second call than the first
            said (a counter grew): the buffer sized from the first is cut."""

            def __init__(self):
                self.calls = 0

            def __getattr__(self, name):
                return getattr(real, name)

            def ucmgo_stats(self, h, buf, size):
                self.calls += 1
                text = json.dumps({"pad": "x" * (300 if self.calls > 1 else 0), **json.loads(real_text())})
                if buf is not None and size > 0:
                    data = text.encode()[: size - 1]
                    ctypes.memmove(buf, data + b"\0", len(data) + 1)
                return len(text)

        def real_text():
            n = real.ucmgo_stats(store._h, None, 0)
            b = ctypes.create_string_buffer(n + 1024)
            real.ucmgo_stats(store._h, b, n + 1024)
            return b.value.decode()

        store._lib = Growing()
        try:
            st = store.stats()
        finally:
            store._lib = real
        assert st["pad"] == "x" * 300 and "layout" in st
