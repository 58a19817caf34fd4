"""ucmgo.sparse.esa.retrieval_backend against UCM's own retrieval_backend, built from UCM's
source by /work/shared/tools/ucm-sparse-ref/build.sh (never part of this repository): same
inputs to both modules in one process. Skipped unless UCM_SPARSE_REF names the directory
holding UCM's built module (e.g. /tmp/ucm-sparse-ref/lib).

* Exact regime: values whose every partial sum is exact in float32 whatever the summation
  order (entries in {-1, 0, 1} on at most 64 dims of the query, plus a tie-break column
  perm(row)·2^-15 that the query weights by 1): every score is distinct and both modules must
  give bit-identical indices and scores, in the same order.
* Float regime (UCM's demo data, torch.rand, and Gaussian): per row the same set of indices,
  except swaps across the k-th score where the float64 scores differ by less than 1e-5
  relative (near ties; the count is printed, expected 0); every shared index's score within
  float32 rounding of UCM's.
* Semantics: the same sequence of submit, poll, wait and get_result calls, the error
  messages included, gives the same transcript on both.
"""

import os
import sys

import numpy as np
import pytest

from ucmgo.sparse.esa.retrieval_backend import RetrievalWorkerBackend as Ours

REF = os.environ.get("UCM_SPARSE_REF", "")
pytestmark = pytest.mark.skipif(not REF or not os.path.isdir(REF),
                                reason="UCM_SPARSE_REF does not name UCM's built retrieval_backend (ucm-sparse-ref)")


@pytest.fixture(scope="module")
def ucm():
    sys.path.insert(0, REF)
    try:
        import retrieval_backend  # UCM's module, built outside the repository
    finally:
        sys.path.remove(REF)
    return retrieval_backend.RetrievalWorkerBackend


def run(cls, data, query, topk, idx):
    be = cls(data, {0: [0, 1]})
    rid = be.submit(query, topk, idx)
    be.wait(rid)
    return be.get_result(rid)


def exact_inputs(rng, rows, dim, batch, nonzero=64):
    data = rng.integers(-1, 2, size=(rows, dim)).astype(np.float32)
    data[:, -1] = rng.permutation(rows).astype(np.float32) * np.float32(2.0 ** -15)
    query = np.zeros((batch, dim), dtype=np.float32)
    for b in range(batch):
        cols = rng.choice(dim - 1, size=min(nonzero, dim - 1), replace=False)
        query[b, cols] = rng.integers(-1, 2, size=cols.size)
    query[:, -1] = 1
    return data, query


CASES = [
    # UCM's demo: 25,600 rows × 1,024, batch 2, top 3,000 of 8,000 candidates per row.
    ("demo", 25600, 1024, 2, 3000, lambda rows: np.arange(16000, dtype=np.int32).reshape(2, -1)),
    # 1,024 blocks of 32 KV heads × 128: batch 1 and 2, every block a candidate, k 307 (30 %).
    ("1024x4096 b1", 1024, 4096, 1, 307, lambda rows: np.arange(1024, dtype=np.int32).reshape(1, -1)),
    ("1024x4096 b2", 1024, 4096, 2, 307, lambda rows: np.tile(np.arange(1024, dtype=np.int32), (2, 1))),
]


@pytest.mark.parametrize("name,rows,dim,batch,topk,cand", CASES, ids=[c[0] for c in CASES])
def test_exact_regime_bit_identical(ucm, name, rows, dim, batch, topk, cand):
    rng = np.random.default_rng(rows + dim + batch)
    data, query = exact_inputs(rng, rows, dim, batch)
    idx = cand(rows)
    want = run(ucm, data, query, topk, idx)
    got = run(Ours, data, query, topk, idx)
    assert got["indices"].dtype == want["indices"].dtype and got["scores"].dtype == want["scores"].dtype
    assert got["indices"].shape == want["indices"].shape == (batch, topk)
    np.testing.assert_array_equal(got["indices"], want["indices"])
    assert got["scores"].tobytes() == want["scores"].tobytes()
    assert (np.diff(got["scores"], axis=1) < 0).all()  # distinct, descending


def test_exact_regime_padding_and_ragged_candidates(ucm):
    """-1 padding spread over the rows (each row keeps at least k candidates, where UCM is
    defined) and candidates in shuffled order."""
    rng = np.random.default_rng(5)
    data, query = exact_inputs(rng, 5000, 256, 3)
    idx = np.stack([rng.permutation(5000)[:2000] for _ in range(3)]).astype(np.int32)
    idx[rng.random(idx.shape) < 0.3] = -1
    want = run(ucm, data, query, 500, idx)
    got = run(Ours, data, query, 500, idx)
    np.testing.assert_array_equal(got["indices"], want["indices"])
    assert got["scores"].tobytes() == want["scores"].tobytes()


def near_tie_mismatches(data, query, idx, got, want):
    """Rows' index sets must match, except swaps across the k-th score whose float64 scores are
    within 1e-5 relative of the boundary: returns how many such swaps there were."""
    swaps = 0
    for b in range(query.shape[0]):
        g, w = set(got["indices"][b].tolist()), set(want["indices"][b].tolist())
        if g == w:
            continue
        s64 = data[list(g | w)].astype(np.float64) @ query[b].astype(np.float64)
        scores = dict(zip(list(g | w), s64))
        boundary = min(scores[i] for i in w)
        scale = max(abs(boundary), 1e-30)
        for i in g ^ w:
            assert abs(scores[i] - boundary) <= 1e-5 * scale, \
                "row %d: index %d (float64 %r) differs from UCM's set beyond a near tie (boundary %r)" % (b, i, scores[i], boundary)
            swaps += 1
    return swaps


@pytest.mark.parametrize("dist", ["rand", "gauss"])
@pytest.mark.parametrize("name,rows,dim,batch,topk,cand", CASES, ids=[c[0] for c in CASES])
def test_float_regime_same_sets(ucm, dist, name, rows, dim, batch, topk, cand):
    rng = np.random.default_rng(7)
    if dist == "rand":  # UCM's demo (retrieval_worker.py's __main__): torch.rand
        data = rng.random((rows, dim), dtype=np.float32)
        query = rng.random((batch, dim), dtype=np.float32)
    else:
        data = rng.standard_normal((rows, dim), dtype=np.float32)
        query = rng.standard_normal((batch, dim), dtype=np.float32)
    idx = cand(rows)
    want = run(ucm, data, query, topk, idx)
    got = run(Ours, data, query, topk, idx)
    assert got["indices"].shape == want["indices"].shape
    swaps = near_tie_mismatches(data, query, idx, got, want)
    print("%s %s: %d near-tie swaps" % (name, dist, swaps))
    # Scores of the indices both chose agree to float32 rounding (different summation orders).
    for b in range(batch):
        ours = dict(zip(got["indices"][b].tolist(), got["scores"][b].tolist()))
        for i, s in zip(want["indices"][b].tolist(), want["scores"][b].tolist()):
            if i in ours:
                mag = float(np.abs(data[i].astype(np.float64) * query[b]).sum())
                assert abs(ours[i] - s) <= 1e-5 * mag + 1e-6, (b, i, ours[i], s)
        assert (np.diff(got["scores"][b]) <= 0).all()


def transcript(cls, data, query, idx):
    """A sequence of calls and what each returned or raised."""
    out = []

    def call(name, fn, *args):
        try:
            r = fn(*args)
            if isinstance(r, dict):
                r = sorted((k, v.dtype.str, v.shape) for k, v in r.items())
            out.append((name, "ok", r))
        except Exception as e:  # the type and message are the transcript
            out.append((name, type(e).__name__, str(e)))

    be = cls(data, {0: [0, 1]})
    call("submit", be.submit, query, 5, idx)
    call("wait", be.wait, 0)
    call("poll", be.poll, 0)
    call("wait again", be.wait, 0)
    call("get_result", be.get_result, 0)
    call("poll taken", be.poll, 0)
    call("get_result taken", be.get_result, 0)
    call("wait taken", be.wait, 0)
    call("wait unknown", be.wait, 99)
    call("poll unknown", be.poll, 99)
    call("get_result unknown", be.get_result, 99)
    call("submit dim", be.submit, query[:, :-1], 5, idx)
    call("submit batch", be.submit, query, 5, idx[:1])
    call("submit after errors", be.submit, query, 5, idx)
    call("wait 1", be.wait, 1)
    call("get_result 1", be.get_result, 1)
    call("submit k above candidates", be.submit, query, 500, idx)
    call("wait 2", be.wait, 2)
    call("get_result 2", be.get_result, 2)
    return out


def test_semantics_transcripts_equal(ucm):
    rng = np.random.default_rng(11)
    data, query = exact_inputs(rng, 300, 32, 2)
    idx = np.stack([rng.permutation(300)[:100], rng.permutation(300)[:100]]).astype(np.int32)
    idx[:, ::10] = -1  # the same count of -1 in each row
    want = transcript(ucm, data, query, idx)
    got = transcript(Ours, data, query, idx)
    for w, g in zip(want, got):
        assert g == w, "%s: ours %r, UCM's %r" % (w[0], g, w)
    assert len(got) == len(want)
    messages = {m for _, kind, m in want if kind == "RuntimeError"}
    assert messages == {"Result not ready", "Bad req_id", "Query dim mismatch", "Query and indexes batch mismatch"}


def test_data_aliasing_as_ucm(ucm):
    """Both see a write to the float32 tensor after construction (ESA writes rows later)."""
    import torch
    for cls in (ucm, Ours):
        data = torch.zeros((64, 8), dtype=torch.float32)
        be = cls(data, {0: [0]})
        data[41] = 1.0
        rid = be.submit(np.ones((1, 8), dtype=np.float32), 1, np.arange(64, dtype=np.int32).reshape(1, -1))
        be.wait(rid)
        assert be.get_result(rid)["indices"].tolist() == [[41]], cls
