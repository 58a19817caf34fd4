"""ucmgo.sparse.Selector through libucmgo.so: representations from K and precomputed, stored as
the blocks' sidecars and loaded by id (across a restart), selections synchronous and as tasks,
and bad input."""

import time

import numpy as np
import pytest
import torch

from helpers import LAYERS, layerwise_config, random_ids
from ucmgo import ENOOBJ, EPARAM, UcmGoError, UcmGoStore
from ucmgo.sparse import Selector

BS, KV, QH, HD = 128, 2, 8, 64  # K of one layer of one block: 128 × 2 × 64 float16 = 32 KiB
SHAPE = {"layers": LAYERS, "q_heads": QH, "kv_heads": KV, "head_dim": HD, "block_size": BS}


def make_k(n, seed=0):
    """K of n blocks, [n, layers, bs, kv, hd] float16, each block around its own direction."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, LAYERS, 1, KV, HD, generator=g)
    return (torch.randn(n, LAYERS, BS, KV, HD, generator=g) * 0.5 + base).half()


def dump_blocks(store, ids, k):
    """Stores the blocks layer by layer: each layer's shard is its K then a V of zeros."""
    v = torch.zeros(BS * KV * HD, dtype=torch.float16)
    for layer in range(LAYERS):
        rows = [[k[i, layer].contiguous().view(-1), v] for i in range(len(ids))]
        store.wait(store.dump(ids, [layer] * len(ids), rows))


@pytest.fixture
def stored(backend):
    store = UcmGoStore(layerwise_config(backend))
    ids = random_ids(20)
    k = make_k(len(ids))
    dump_blocks(store, ids, k)
    yield store, ids, k
    store.close()


def test_dump_reprs_load_and_missing_block(stored):
    """ESA means computed from K in the library equal K's means (float16 rounding); a block not
    stored fails alone and loads as not found with zeros."""
    store, ids, k = stored
    with Selector(store, {"ESA": {"sparse_ratio": 0.3}}, SHAPE) as sel:
        assert (sel.kind, sel.layers, sel.rows, sel.heads, sel.cols) == ("esa-mean", LAYERS, 1, KV, HD)
        missing = random_ids(1)[0]
        task = sel.dump_reprs(ids + [missing], torch.cat([k, k[:1]]))
        with pytest.raises(UcmGoError) as e:
            store.wait(task)
        assert e.value.status == ENOOBJ
        assert task.failed == [False] * len(ids) + [True]
        for layer in range(LAYERS):
            vals, found = sel.load_reprs(layer, ids + [missing])
            assert found.tolist() == [True] * len(ids) + [False]
            assert not vals[-1].any()
            want = k[:, layer].float().mean(dim=1).numpy()  # [n, kv, hd]
            np.testing.assert_allclose(vals[:-1, 0], want, rtol=2e-3, atol=2e-3)


def test_reprs_survive_restart(backend):
    """Representations dumped, the store closed and opened again: the same values load."""
    ids = random_ids(6)
    k = make_k(len(ids), seed=3)
    with UcmGoStore(layerwise_config(backend)) as store:
        dump_blocks(store, ids, k)
        sel = Selector(store, {"Quest": {}}, SHAPE)
        store.wait(sel.dump_reprs(ids, [[k[i, l].numpy() for l in range(LAYERS)] for i in range(len(ids))]))
        before = [sel.load_reprs(l, ids)[0] for l in range(LAYERS)]
        sel.close()
    with UcmGoStore(layerwise_config(backend)) as store:
        sel = Selector(store, {"Quest": {}}, SHAPE)
        for l in range(LAYERS):
            vals, found = sel.load_reprs(l, ids)
            assert found.all() and vals.tobytes() == before[l].tobytes()
            # Quest: per-channel min then max of K over the block's tokens (exact in float16).
            np.testing.assert_array_equal(vals[:, 0], k[:, l].float().amin(dim=1).numpy())
            np.testing.assert_array_equal(vals[:, 1], k[:, l].float().amax(dim=1).numpy())
        sel.close()


def test_dump_reprs_bfloat16_k(stored):
    """K in bfloat16 (a CPU torch tensor): Quest's bounds are its exact per-channel min and max."""
    store, ids, _ = stored
    k = make_k(4, seed=5).float().bfloat16()
    with Selector(store, {"Quest": {}}, SHAPE) as sel:
        store.wait(sel.dump_reprs(ids[:4], k))
        for l in range(LAYERS):
            vals, found = sel.load_reprs(l, ids[:4])
            assert found.all()
            np.testing.assert_array_equal(vals[:, 0], k[:, l].float().amin(dim=1).numpy())
            np.testing.assert_array_equal(vals[:, 1], k[:, l].float().amax(dim=1).numpy())


def test_select_orders_by_score(stored):
    """The middle blocks a step selects all score at least as high as those it leaves out
    (ESA: the sum over KV heads of the GQA-reduced query · the block's mean), the windows are
    kept, and the asynchronous form gives the synchronous answer."""
    store, ids, k = stored
    with Selector(store, {"ESA": {"sparse_ratio": 0.3}}, SHAPE) as sel:
        store.wait(sel.dump_reprs(ids, k))
        g = torch.Generator().manual_seed(9)
        seq_len = len(ids) * BS + 7  # a partial last block without an id
        n = len(ids) + 1
        for layer in range(LAYERS):
            q = torch.randn(QH, HD, generator=g)
            blocks = sel.select("r", layer, 0, q, ids, seq_len)
            assert blocks.dtype == np.int32 and list(blocks) == sorted(set(blocks.tolist()))
            assert 0 < len(blocks) < n and blocks[0] == 0 and blocks[-1] == n - 1 and blocks[-2] == n - 2
            reprs, _ = sel.load_reprs(layer, ids)
            qr = q.numpy().reshape(KV, QH // KV, HD).mean(axis=1)  # [kv, hd]
            score = np.einsum("nkd,kd->n", reprs[:, 0].astype(np.float64), qr.astype(np.float64))
            middle = set(range(1, n - 2))
            chosen = sorted(middle & set(blocks.tolist()))
            left = sorted(middle - set(blocks.tolist()))
            assert chosen and left
            assert score[chosen].min() >= score[left].max() - 1e-4, (layer, chosen, left)
            task = sel.submit_select("r2", layer, 0, q, ids, seq_len)
            assert np.array_equal(sel.result(task), blocks)
        sel.request_finished("r")
        sel.request_finished("r2")


def test_submit_poll_wait_result_per_head(stored):
    """Tasks: poll turns true, wait is repeatable, result consumes; per KV head (head_select
    kv) each head's selection is returned and their union is the blocks."""
    store, ids, k = stored
    with Selector(store, {"ESA": {"sparse_ratio": 0.3, "head_select": "kv", "head_score": "softmax"}}, SHAPE) as sel:
        store.wait(sel.dump_reprs(ids, k))
        q = np.random.default_rng(1).standard_normal((3, QH, HD)).astype(np.float32)  # 3 tokens: the last selects
        tasks = [sel.submit_select("r", 2, step, q, ids, len(ids) * BS, per_head=True) for step in range(4)]
        for t in tasks:
            deadline = time.time() + 30
            while not sel.poll(t):
                assert time.time() < deadline
                time.sleep(0.001)
            sel.wait(t)
            sel.wait(t)
            blocks, heads = sel.result(t)
            assert len(heads) == KV
            assert sorted(set(np.concatenate(heads).tolist())) == blocks.tolist()
            with pytest.raises(UcmGoError) as e:
                sel.result(t)
            assert e.value.status == ENOOBJ
        with pytest.raises(UcmGoError) as e:
            sel.poll(tasks[0])
        assert e.value.status == ENOOBJ


def test_put_reprs_round_trip(stored):
    """Precomputed KVStar representations (channels row, then merged rows) load back exactly."""
    store, ids, _ = stored
    with Selector(store, {"KVStarMultiStep": {}}, SHAPE) as sel:
        assert sel.kind == "kvstar"
        rng = np.random.default_rng(2)
        reprs = (rng.integers(-512, 512, (3, sel.layers, sel.rows, sel.heads, sel.cols)) / 64).astype(np.float32)
        reprs[:, :, 0] = np.arange(sel.cols) * 2  # kept channels: ascending, below head_dim
        store.wait(sel.put_reprs(ids[:3], reprs))
        for l in range(sel.layers):
            vals, found = sel.load_reprs(l, ids[:3])
            assert found.all() and np.array_equal(vals, reprs[:, l])


def test_bad_input(stored):
    """Every malformed call raises EPARAM with a message naming the field."""
    store, ids, k = stored

    def eparam(fn, want):
        with pytest.raises(UcmGoError) as e:
            fn()
        assert e.value.status == EPARAM and want in str(e.value), str(e.value)

    eparam(lambda: Selector(store, {"ESA": {"sparse_ratio": 7}}, SHAPE), "sparse_ratio")
    eparam(lambda: Selector(store, {"Nope": {}}, SHAPE), "Nope")
    eparam(lambda: Selector(store, {"ESA": {}}, dict(SHAPE, q_heads=3)), "query heads 3")
    eparam(lambda: Selector(store, {"ESA": {}}, dict(SHAPE, extra=1)), "extra")
    with Selector(store, {"ESA": {}}, SHAPE) as sel:
        q = np.zeros((QH, HD), np.float32)
        eparam(lambda: sel.dump_reprs(ids[:1], k[:1].int()), "dtype")
        eparam(lambda: sel.dump_reprs(ids[:1], k[:1, :3]), "K of 3 layers")
        eparam(lambda: sel.select("r", LAYERS, 0, q, ids, len(ids) * BS), "layer 8")
        eparam(lambda: sel.select("r", 0, 0, q[:, :5], ids, len(ids) * BS), "query of 40")
        eparam(lambda: sel.select("r", 0, 0, q, ids, BS), "20 block ids for seq_len 128")
        eparam(lambda: sel.select("", 0, 0, q, ids, len(ids) * BS), "request id")
        eparam(lambda: sel.select("r", 0, 0, q, [b"short"], BS), "position 0")
        eparam(lambda: sel.load_reprs(-1, ids), "layer -1")
        eparam(lambda: sel.put_reprs(ids[:1], np.zeros(3, np.float32)), "3 values")
