"""ucmgo.sparse.kvstar.kvstar_retrieve and ucmgo.sparse.gsa.gsa_offload_ops against UCM's own
modules, built from UCM's source by /work/shared/tools/ucm-sparse-ref/build.sh (never part of
this repository): same inputs to both in one process. Skipped unless UCM_SPARSE_REF names the
directory holding UCM's built modules (e.g. /tmp/ucm-sparse-ref/lib).

* KVStar (float16 inputs, UCM's approximate exp, its ids in no defined order): the same set
  of block ids, except swaps across the k-th score where the float64 scores differ by less
  than 1e-5 relative (near ties; counted, expected 0), with and without dPrunedIndex, one and
  four query tokens, 32 query heads over 8 KV heads, 4 rows per block. The semantics: task
  ids, Wait's codes, GetTaskResult's dicts, and the documented deviation on a bad call.
* GSA (exact regime: small integers and group sizes that are powers of two, so that every
  mean, dot product and sum is exact in float32 whatever the order): the whole topk caches
  and q caches identical after a step over several layers and requests (one not decoding, one
  with fewer blocks than the windows, scattered decode rows), and after a second step without
  set_topk_param (neither module selects).
"""

import ctypes
import os
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ucmgo.sparse.gsa import gsa_offload_ops as ours_gsa  # noqa: E402
from ucmgo.sparse.kvstar import kvstar_retrieve as ours_kv  # noqa: E402

REF = os.environ.get("UCM_SPARSE_REF", "")
pytestmark = pytest.mark.skipif(not REF or not os.path.isdir(REF),
                                reason="UCM_SPARSE_REF does not name UCM's built modules (ucm-sparse-ref)")


def _load(name):
    sys.path.insert(0, REF)
    try:
        return __import__(name)  # UCM's module, built outside the repository
    finally:
        sys.path.remove(REF)


@pytest.fixture(scope="module")
def ucm_kv():
    kv = _load("kvstar_retrieve")
    assert kv.Setup(kv.SetupParam(cpuNumaIds=[0], bindInfo=[(0, 0), (1, 0)], deviceType=kv.CPU,
                                  totalTpSize=1, localRankId=0)) == 0
    return kv


@pytest.fixture(scope="module")
def ucm_gsa():
    return _load("gsa_offload_ops")


def _keep(obj):
    """UCM's CalKpreAndTopk destructor never returns (its calculate thread waits on a
    predicate that is false once m_running is): the object is kept for the process's life."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    return obj


def kv_ref(q, r, idx):
    """KVStar's block scores in float64 from the same float16 values."""
    qf, rf = q.double(), r.double()
    x, nh, _ = q.shape
    n, m, h, _ = r.shape
    g = nh // h
    tot = torch.zeros(n, dtype=torch.float64)
    for t in range(x):
        for hq in range(nh):
            kh = hq // g
            qq = qf[t, hq] if idx is None else qf[t, hq, idx[kh]]
            logits = (rf[:, :, kh, :] * qq).sum(-1).reshape(-1)
            tot += torch.softmax(logits, 0).reshape(n, m).sum(1)
    return tot.numpy()


def run_kv(mod, q, r, idx, k):
    t = mod.AsyncRetrieveByCPU(q, r, idx, k, 1, mod.CPU)
    assert mod.Wait(t) == 0
    res = mod.GetTaskResult(t)
    assert res["status"] == "SUCCESS", res
    return res["data"]


def near_tie_swaps(got, want, scores):
    """The ids in one set and not the other; fails unless each such pair is a near tie."""
    a, b = sorted(set(got) - set(want)), sorted(set(want) - set(got))
    assert len(a) == len(b)
    for i, j in zip(a, b):
        assert abs(scores[i] - scores[j]) <= 1e-5 * max(abs(scores[j]), 1e-30), (i, j, scores[i], scores[j])
    return len(a)


KV_CASES = [  # x, H, d, n, M, h, d', pruned
    (1, 32, 128, 300, 4, 8, 128, False),
    (4, 32, 128, 300, 4, 8, 128, False),
    (1, 32, 128, 300, 4, 8, 64, True),
    (4, 32, 128, 257, 4, 8, 64, True),
]


@pytest.mark.parametrize("x,nh,d,n,m,h,dp,pruned", KV_CASES)
def test_kvstar_same_set(ucm_kv, x, nh, d, n, m, h, dp, pruned):
    gen = torch.Generator().manual_seed(n * 7 + x + dp)
    q = (torch.randn(x, nh, d, generator=gen) * 0.5).half()
    r = (torch.randn(n, m, h, dp, generator=gen) * 0.5).half()
    idx = torch.stack([torch.randperm(d, generator=gen)[:dp] for _ in range(h)]).long().contiguous() if pruned else None
    k = int(n * 0.3)
    want = run_kv(ucm_kv, q, r, idx, k)
    got = run_kv(ours_kv, q, r, idx, k)
    assert len(got) == len(want) == k
    scores = kv_ref(q, r, idx)
    swaps = near_tie_swaps(got, want, scores)
    print("kvstar x=%d pruned=%s: %d near-tie swaps" % (x, pruned, swaps))
    assert swaps == 0
    # Ours: descending by score (up to float32 rounding), one of the orders UCM may return.
    s = scores[got]
    assert (np.diff(s) <= 1e-6 * s[:-1]).all()


def test_kvstar_semantics(ucm_kv):
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 8, 32, generator=gen).half()
    r = torch.randn(40, 4, 2, 32, generator=gen).half()
    for mod in (ucm_kv, ours_kv):
        assert (int(mod.CPU), int(mod.GPU), int(mod.DeviceType.CPU), int(mod.DeviceType.GPU)) == (0, 2, 0, 2)
        p = mod.SetupParam(cpuNumaIds=[0], bindInfo=[(0, 0)], deviceType=mod.CPU, totalTpSize=1, localRankId=0)
        p.localRankId = 3
        assert (p.cpuNumaIds, p.bindInfo, p.totalTpSize, p.localRankId) == ([0], [(0, 0)], 1, 3)
        t1 = mod.AsyncRetrieveByCPU(q, r, None, 5, 1, mod.CPU)
        t2 = mod.AsyncRetrieveByCPU(q, r, None, 5, 2, mod.CPU)
        assert t2 == t1 + 1
        assert mod.Wait(t1) == 0
        assert mod.Wait(t1) == -50003  # a waiter is consumed
        assert mod.Wait(10 ** 9) == -50003
        res = mod.GetTaskResult(t1)
        assert set(res) == {"status", "data"} and res["status"] == "SUCCESS" and len(res["data"]) == 5
        assert mod.GetTaskResult(t1) == res  # repeatable
        assert sorted(mod.GetTaskResult(t1)["data"]) == sorted(res["data"])
        assert mod.GetTaskResult(10 ** 9) is None
        mod.Wait(t2)
    # A bad call (dims differ, no dPrunedIndex): UCM reports SUCCESS with no ids and Wait 0
    # (its runner's failure overwritten); ours FAILURE with the error and Wait -1.
    bad_r = torch.randn(40, 4, 2, 16, generator=gen).half()
    t = ucm_kv.AsyncRetrieveByCPU(q, bad_r, None, 5, 3, ucm_kv.CPU)
    assert ucm_kv.Wait(t) == 0 and ucm_kv.GetTaskResult(t) == {"status": "SUCCESS", "data": []}
    t = ours_kv.AsyncRetrieveByCPU(q, bad_r, None, 5, 3, ours_kv.CPU)
    res = ours_kv.GetTaskResult(t)
    assert ours_kv.Wait(t) == -1 and res["status"] == "FAILURE" and "no dPrunedIndex" in res["error"]


def gsa_step(mod, layers, q, kpre, mapping, cal_idx, is_decode, lens, width, maxbs, qh, kvh, d, select=True):
    """One GSA step on a fresh module: the topk caches and q caches after it."""
    op = mod.CalKpreAndTopk(layers, 16, maxbs, qh, d)
    if mod is not ours_gsa:
        _keep(op)
    op.set_kpre_method_param(kvh, 1)
    op.set_kpre_cache([k.clone() for k in kpre])
    topk = [torch.full((maxbs, width), -7, dtype=torch.int32) for _ in range(layers)]
    op.set_common_param(cal_idx, is_decode)
    if select:
        op.set_topk_param(mapping)
    op.set_topk_cache(topk, lens)
    locations = [i if i < q.shape[0] else -1 for i in range(maxbs)]
    for layer in range(layers):
        op.add_copy_req(False, layer, locations, q[layer])
    deadline = time.monotonic() + 30
    time.sleep(0.05)  # UCM's is_calculate_finish is True until its copy thread runs
    while not op.is_calculate_finish():
        assert time.monotonic() < deadline, "is_calculate_finish never True"
        time.sleep(0.001)
    return [t.clone() for t in topk], [c.clone() for c in op.q_cache]


@pytest.mark.parametrize("qh,kvh", [(32, 8), (8, 8), (16, 2)])
def test_gsa_same_caches(ucm_gsa, qh, kvh):
    layers, d, maxbs, slots, width = 4, 128, 6, 400, 40
    gen = torch.Generator().manual_seed(qh * 100 + kvh)
    kpre = [torch.randint(-1, 2, (slots, 1, kvh, d), generator=gen).float() for _ in range(layers)]
    q = torch.randint(-2, 3, (layers, 5, qh, d), generator=gen).float()
    # Requests 0, 1, 3 and 4 decode (a gap at 2); 4 has 3 blocks (the windows cover them).
    mapping = [list(range(10, 60)), list(range(100, 130)), [5, 6], list(range(200, 237)), [300, 301, 302]]
    is_decode = [True, True, False, True, True]
    cal_idx = [0, 1, 3, 4]
    lens = [12, 7, 30, 2]
    want = gsa_step(ucm_gsa, layers, q, kpre, mapping, cal_idx, is_decode, lens, width, maxbs, qh, kvh, d)
    got = gsa_step(ours_gsa, layers, q, kpre, mapping, cal_idx, is_decode, lens, width, maxbs, qh, kvh, d)
    for layer in range(layers):
        assert torch.equal(got[0][layer], want[0][layer]), (layer, got[0][layer], want[0][layer])
        assert torch.equal(got[1][layer], want[1][layer]), layer
    assert not torch.equal(want[0][0], torch.full_like(want[0][0], -7))  # something was selected
    # Without set_topk_param, neither selects (UCM's flag resets after every step).
    want = gsa_step(ucm_gsa, 2, q, kpre, mapping, cal_idx, is_decode, lens, width, maxbs, qh, kvh, d, select=False)
    got = gsa_step(ours_gsa, 2, q, kpre, mapping, cal_idx, is_decode, lens, width, maxbs, qh, kvh, d, select=False)
    for layer in range(2):
        assert torch.equal(got[0][layer], want[0][layer]) and torch.equal(got[1][layer], want[1][layer])
