"""ESA's retrieval over the representations the store holds, read by block id:
Selector.retrieve_dot and ucmgo.sparse.esa.retrieval_backend.StoreRetrievalBackend against
the matrix-form drop-in (RetrievalWorkerBackend) over the same representations, blocks without
one, and bad input."""

import numpy as np
import pytest
import torch

from helpers import LAYERS, layerwise_config, random_ids
from ucmgo import EPARAM, UcmGoError, UcmGoStore
from ucmgo.sparse import Selector
from ucmgo.sparse.esa.retrieval_backend import RetrievalWorkerBackend, StoreRetrievalBackend

BS, KV, QH, HD = 16, 2, 4, 32  # one layer of a block's ESA representation: 2 × 32 floats
SHAPE = {"layers": LAYERS, "q_heads": QH, "kv_heads": KV, "head_dim": HD, "block_size": BS}
DIM = KV * HD
N = 40


@pytest.fixture
def stored(backend):
    """A store of N blocks with ESA representations put precomputed, one id never stored, and
    the selector. The blocks' K is never read: the representations are the test's."""
    store = UcmGoStore(layerwise_config(backend))
    ids = random_ids(N)
    zero = torch.zeros(32768 // 2, dtype=torch.float16)  # layerwise_config's tensors
    for layer in range(LAYERS):
        store.wait(store.dump(ids, [layer] * N, [[zero, zero] for _ in ids]))
    sel = Selector(store, {"ESA": {"sparse_ratio": 0.3}}, SHAPE)
    rng = np.random.default_rng(5)
    reprs = rng.standard_normal((N, LAYERS, 1, KV, HD)).astype(np.float32)
    store.wait(sel.put_reprs(ids, reprs))
    missing = random_ids(1, salt=b"missing")[0]
    yield store, sel, ids, missing
    sel.close()
    store.close()


def matrix(sel, layer, ids):
    """The representations as the matrix-form drop-in takes them: load_reprs's rows."""
    vals, found = sel.load_reprs(layer, ids)
    return np.ascontiguousarray(vals.reshape(len(ids), -1)), found


def drop_in(data, query, topk, indexes):
    be = RetrievalWorkerBackend(data, {0: [0, 1]})
    try:
        rid = be.submit(query, topk, indexes)
        be.wait(rid)
        return be.get_result(rid)
    finally:
        be.close()


def test_retrieve_dot_equals_the_matrix_form(stored):
    """Every block a candidate, and a candidate table with padding and duplicates: the indices
    and scores equal the drop-in's over load_reprs's matrix, bit for bit; the block without a
    representation (last) is no candidate."""
    _, sel, ids, missing = stored
    all_ids = ids + [missing]
    rng = np.random.default_rng(7)
    q = rng.standard_normal((3, DIM)).astype(np.float32)
    for layer in (0, LAYERS - 1):
        data, found = matrix(sel, layer, all_ids)
        assert found.tolist() == [True] * N + [False]
        every = np.tile(np.arange(N, dtype=np.int32), (3, 1))
        for topk in (1, 10, N, N + 5):
            got = sel.retrieve_dot(layer, all_ids, q, topk, workers=2)
            want = drop_in(data, q, topk, every)
            assert got["found"].tolist() == found.tolist()
            assert got["indices"].shape == (3, min(topk, N))
            np.testing.assert_array_equal(got["indices"], want["indices"])
            assert got["scores"].tobytes() == want["scores"].tobytes()
        cand = rng.integers(-1, N + 1, size=(3, 25)).astype(np.int32)  # N: the missing block
        cand[:, 0] = 3  # row 0 has a block with a representation
        got = sel.retrieve_dot(layer, all_ids, q, 12, candidates=cand)
        want = drop_in(data, q, 12, np.where(cand == N, -1, cand))
        np.testing.assert_array_equal(got["indices"], want["indices"])
        assert got["scores"].tobytes() == want["scores"].tobytes()
        assert N not in got["indices"]


def test_store_backend_equals_the_drop_in(stored):
    """StoreRetrievalBackend: UCM's submit/poll/wait/get_result over the stored representations
    answers as RetrievalWorkerBackend over the matrix; requests in flight together; a torch query."""
    _, sel, ids, missing = stored
    all_ids = [missing] + ids  # the missing block first: position 0 is never returned
    data, _ = matrix(sel, 2, all_ids)
    rng = np.random.default_rng(9)
    be = StoreRetrievalBackend(sel, 2, all_ids, {0: [0], 1: [1]})
    ref = RetrievalWorkerBackend(data, {0: [0, 1]})
    reqs = []
    for i in range(4):
        q = rng.standard_normal((2, DIM)).astype(np.float32)
        idx = rng.integers(0, N + 1, size=(2, 30)).astype(np.int32)
        idx[0, :3] = [1, 2, 3]
        reqs.append((be.submit(torch.from_numpy(q) if i == 1 else q, 7, idx), ref.submit(q, 7, np.where(idx == 0, -1, idx))))
    assert [r for r, _ in reqs] == [0, 1, 2, 3]
    for rid, fid in reqs:
        be.wait(rid)
        be.wait(rid)  # repeatable
        assert be.poll(rid)
        ref.wait(fid)
        got, want = be.get_result(rid), ref.get_result(fid)
        assert set(got) == {"indices", "scores"}
        assert got["indices"].dtype == np.int32 and got["scores"].dtype == np.float32
        np.testing.assert_array_equal(got["indices"], want["indices"])
        assert got["scores"].tobytes() == want["scores"].tobytes()
        assert 0 not in got["indices"]
        assert not be.poll(rid)
        be.wait(rid)  # done and taken
        with pytest.raises(RuntimeError, match="Result not ready"):
            be.get_result(rid)
    be.close()
    ref.close()


def test_missing_blocks_pad_the_rows(stored):
    """Row 0 with 2 candidates that have a representation sets k = 2; row 1 with one pads with
    -1 and -inf; a row of only blocks without one is all padding."""
    _, sel, ids, missing = stored
    all_ids = ids[:3] + [missing]
    q = np.ones((3, DIM), dtype=np.float32)
    cand = np.array([[0, 3, 1, -1], [3, 2, -1, 3], [3, 3, -1, -1]], dtype=np.int32)
    got = sel.retrieve_dot(1, all_ids, q, 5, candidates=cand)
    assert got["found"].tolist() == [True, True, True, False]
    assert got["indices"].shape == (3, 2)
    assert sorted(got["indices"][0].tolist()) == [0, 1]
    assert got["indices"][1].tolist() == [2, -1] and got["scores"][1, 1] == -np.inf
    assert got["indices"][2].tolist() == [-1, -1]
    empty = sel.retrieve_dot(1, [missing], q, 5)
    assert empty["indices"].shape == (3, 0) and not empty["found"].any()


def test_bad_input(stored):
    store, sel, ids, _ = stored
    q = np.zeros((2, DIM), dtype=np.float32)

    def eparam(match, fn, *args, **kw):
        with pytest.raises(UcmGoError, match=match) as e:
            fn(*args, **kw)
        assert e.value.status == EPARAM

    eparam("dim 63", sel.retrieve_dot, 0, ids, q[:, :-1], 3)
    eparam("query of 1 dimensions", sel.retrieve_dot, 0, ids, q[0], 3)
    eparam("layer 99", sel.retrieve_dot, 99, ids, q, 3)
    eparam("topk -1", sel.retrieve_dot, 0, ids, q, -1)
    eparam("workers 0", sel.retrieve_dot, 0, ids, q, 3, workers=0)
    eparam(r"row 1, column 0", sel.retrieve_dot, 0, ids, q, 3, candidates=np.array([[0], [N]]))
    eparam("want \\[batch 2, width\\]", sel.retrieve_dot, 0, ids, q, 3, candidates=np.zeros((3, 1), dtype=np.int32))
    eparam("dtype int", sel.retrieve_dot, 0, ids, q, 3, candidates=np.zeros((2, 1), dtype=np.float32))
    eparam("block id at position 1", sel.retrieve_dot, 0, [ids[0], b"short"], q, 3)
    with Selector(store, {"Quest": {}}, SHAPE) as quest:
        eparam("not one row per block", quest.retrieve_dot, 0, ids, np.zeros((1, 2 * DIM), dtype=np.float32), 3)
        with pytest.raises(ValueError, match="rows per block"):
            StoreRetrievalBackend(quest, 0, ids, {0: [0]})
    with pytest.raises(ValueError, match="no core"):
        StoreRetrievalBackend(sel, 0, ids, {})
    be = StoreRetrievalBackend(sel, 0, ids, {0: [0]})
    with pytest.raises(RuntimeError, match="Query dim mismatch"):
        be.submit(np.zeros((1, DIM + 1), dtype=np.float32), 3, np.zeros((1, 2), dtype=np.int32))
    with pytest.raises(RuntimeError, match="Query and indexes batch mismatch"):
        be.submit(q, 3, np.zeros((1, 2), dtype=np.int32))
    with pytest.raises(IndexError, match=r"indexes\[1, 0\] = 40"):
        be.submit(q, 3, np.array([[0], [N]], dtype=np.int32))
    with pytest.raises(ValueError, match="topk -2"):
        be.submit(q, -2, np.zeros((2, 1), dtype=np.int32))
    with pytest.raises(RuntimeError, match="Bad req_id"):
        be.wait(5)
    with pytest.raises(RuntimeError, match="Result not ready"):
        be.get_result(5)
    # A layer the selector does not have: the retrieval's error is raised by wait.
    bad = StoreRetrievalBackend(sel, 99, ids, {0: [0]})
    rid = bad.submit(q, 3, np.zeros((2, 1), dtype=np.int32))
    with pytest.raises(UcmGoError, match="layer 99"):
        bad.wait(rid)
    be.close()
    bad.close()
