"""ucmgo.sparse.esa.retrieval_backend: UCM's RetrievalWorkerBackend interface and semantics
over libucmgo.so's retriever (without UCM: test_sparse_ucm_equal.py compares with UCM's own)."""

import threading

import numpy as np
import pytest
import torch

from ucmgo.sparse.esa.retrieval_backend import RetrievalWorkerBackend


def reference(data, query, topk, indexes):
    """Brute force in float64: per row the topk candidates by score descending, ties to the
    earlier candidate; k = min(topk, row 0's candidates)."""
    out_i, out_s = [], []
    for q, row in zip(query.astype(np.float64), indexes):
        cand = [int(c) for c in row if c != -1]
        s = data[cand].astype(np.float64) @ q if cand else np.zeros(0)
        order = sorted(range(len(cand)), key=lambda j: (-s[j], j))[:topk]
        out_i.append([cand[j] for j in order])
        out_s.append([s[j] for j in order])
    k = len(out_i[0]) if out_i else 0
    return out_i, out_s, k


def exact_inputs(rng, rows, dim, batch, width):
    """Values whose dot products are exact in float32 (small integers): one right answer."""
    data = rng.integers(-1, 2, size=(rows, dim)).astype(np.float32)
    query = rng.integers(-2, 3, size=(batch, dim)).astype(np.float32)
    idx = rng.integers(0, rows, size=(batch, width)).astype(np.int32)
    idx[rng.random(idx.shape) < 0.1] = -1
    return data, query, idx


@pytest.mark.parametrize("rows,dim,batch,width,topk", [(50, 8, 1, 40, 10), (300, 24, 3, 200, 17), (2000, 64, 2, 1500, 300)])
def test_results_equal_the_reference(rows, dim, batch, width, topk):
    rng = np.random.default_rng(rows)
    data, query, idx = exact_inputs(rng, rows, dim, batch, width)
    be = RetrievalWorkerBackend(data, {0: [0, 1]})
    rid = be.submit(query, topk, idx)
    be.wait(rid)
    res = be.get_result(rid)
    want_i, want_s, k = reference(data, query, topk, idx)
    assert res["indices"].dtype == np.int32 and res["scores"].dtype == np.float32
    assert res["indices"].shape == (batch, k) and res["scores"].shape == (batch, k)
    for b in range(batch):
        assert res["indices"][b].tolist() == want_i[b][:k]
        assert res["scores"][b].tolist() == want_s[b][:k]


def test_lifecycle_and_messages():
    rng = np.random.default_rng(1)
    data, query, idx = exact_inputs(rng, 100, 16, 2, 50)
    be = RetrievalWorkerBackend(torch.from_numpy(data), {0: [0], 1: [1]})
    ids = [be.submit(query, 5, idx) for _ in range(3)]
    assert ids == [0, 1, 2]
    be.wait(1)
    be.wait(1)  # repeatable
    assert be.poll(1)
    first = be.get_result(1)
    assert not be.poll(1)  # taken
    be.wait(1)  # still fine after get_result, as UCM's status is never freed
    with pytest.raises(RuntimeError, match="^Result not ready$"):
        be.get_result(1)
    with pytest.raises(RuntimeError, match="^Bad req_id$"):
        be.wait(7)
    assert not be.poll(7)
    with pytest.raises(RuntimeError, match="^Result not ready$"):
        be.get_result(7)
    for rid in (0, 2):
        be.wait(rid)
        r = be.get_result(rid)
        np.testing.assert_array_equal(r["indices"], first["indices"])
    with pytest.raises(RuntimeError, match="^Query dim mismatch$"):
        be.submit(query[:, :8], 5, idx)
    with pytest.raises(RuntimeError, match="^Query and indexes batch mismatch$"):
        be.submit(query, 5, idx[:1])
    bad = idx.copy()
    bad[1, 3] = 100
    with pytest.raises(IndexError, match=r"indexes\[1, 3\] = 100: outside \[-1, 100\)"):
        be.submit(query, 5, bad)
    with pytest.raises(ValueError):
        RetrievalWorkerBackend(data, {})
    assert be.submit(query, 5, idx) == 3  # a refused submit takes no id


def test_result_not_ready_while_running():
    """A request queued behind a long one is not ready: poll False, get_result refused."""
    rng = np.random.default_rng(2)
    data = rng.standard_normal((20000, 1024), dtype=np.float32)
    query = rng.standard_normal((2, 1024), dtype=np.float32)
    idx = np.arange(40000, dtype=np.int32).reshape(2, -1) % 20000
    be = RetrievalWorkerBackend(data, {0: [0]})
    ids = [be.submit(query, 100, idx) for _ in range(4)]
    last = ids[-1]
    if not be.poll(last):  # not done yet (it may be, on an idle machine: then nothing to check)
        with pytest.raises(RuntimeError, match="^Result not ready$"):
            be.get_result(last)
    for rid in ids:
        be.wait(rid)
        assert be.get_result(rid)["indices"].shape == (2, 100)


def test_data_is_aliased():
    """Rows written into data after construction are seen by later requests (ESA writes its
    representation rows into the tensor it constructed the backend with); a non-float32 input
    is copied once."""
    data = torch.zeros((64, 8), dtype=torch.float32)
    be = RetrievalWorkerBackend(data, {0: [0]})
    query = np.ones((1, 8), dtype=np.float32)
    idx = np.arange(64, dtype=np.int32).reshape(1, -1)
    data[37] = 1.0
    rid = be.submit(query, 1, idx)
    be.wait(rid)
    assert be.get_result(rid)["indices"].tolist() == [[37]]
    d64 = np.zeros((64, 8))
    be64 = RetrievalWorkerBackend(d64, {0: [0]})
    d64[5] = 1.0  # a copy was taken: not seen
    rid = be64.submit(query, 1, idx)
    be64.wait(rid)
    assert be64.get_result(rid)["indices"].tolist() == [[0]]


def test_short_rows_and_int64_indexes():
    """Rows with fewer candidates than row 0 are padded with -1 / -inf (UCM: undefined); int64
    indexes are taken (UCM's forcecast); duplicates are scored twice."""
    data = np.eye(4, dtype=np.float32)
    query = np.array([[1, 2, 3, 4], [4, 3, 2, 1]], dtype=np.float32)
    idx = np.array([[0, 1, 2, 3], [3, 3, -1, -1]], dtype=np.int64)
    be = RetrievalWorkerBackend(data, {0: [0]})
    rid = be.submit(query, 3, idx)
    be.wait(rid)
    r = be.get_result(rid)
    assert r["indices"].tolist() == [[3, 2, 1], [3, 3, -1]]
    assert r["scores"].tolist() == [[4, 3, 2], [1, 1, float("-inf")]]


def test_concurrent_submitters():
    rng = np.random.default_rng(3)
    data, query, idx = exact_inputs(rng, 500, 32, 2, 300)
    want_i, _, k = reference(data, query, 20, idx)
    be = RetrievalWorkerBackend(data, {0: [0, 1]})
    errors = []

    def run():
        try:
            for _ in range(20):
                rid = be.submit(query, 20, idx)
                be.wait(rid)
                assert be.get_result(rid)["indices"].tolist() == [w[:k] for w in want_i]
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
