"""ucmgo.sparse.kvstar.kvstar_retrieve and ucmgo.sparse.gsa.gsa_offload_ops without UCM: each
against a brute-force float64 reference of UCM's semantics, and their documented behaviour
where UCM's is a bug or undefined (test_sparse_ucm_equal_kvstar_gsa.py compares them with
UCM's own modules)."""

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ucmgo.sparse.gsa.gsa_offload_ops import CalKpreAndTopk  # noqa: E402
from ucmgo.sparse.kvstar import kvstar_retrieve as kv  # noqa: E402


def kv_scores(q, r, idx):
    qf, rf = q.double(), r.double()
    x, nh, _ = q.shape
    n, m, h, _ = r.shape
    tot = torch.zeros(n, dtype=torch.float64)
    for t in range(x):
        for hq in range(nh):
            kh = hq // (nh // h)
            qq = qf[t, hq] if idx is None else qf[t, hq, idx[kh]]
            tot += torch.softmax((rf[:, :, kh, :] * qq).sum(-1).reshape(-1), 0).reshape(n, m).sum(1)
    return tot.numpy()


@pytest.mark.parametrize("pruned", [False, True])
def test_kvstar_against_reference(pruned):
    gen = torch.Generator().manual_seed(11 + pruned)
    q = torch.randn(3, 16, 64, generator=gen).half()
    r = torch.randn(120, 4, 4, 32 if pruned else 64, generator=gen).half()
    idx = torch.stack([torch.randperm(64, generator=gen)[:32] for _ in range(4)]) if pruned else None
    t = kv.AsyncRetrieveByCPU(q, r, idx, 25, 0, kv.CPU)
    assert kv.Wait(t) == 0 and kv.Wait(t) == -50003
    res = kv.GetTaskResult(t)
    assert res["status"] == "SUCCESS" and len(res["data"]) == 25
    s = kv_scores(q, r, idx)
    order = np.argsort(-s, kind="stable")
    # The best 25, by score descending, up to float32 rounding.
    np.testing.assert_allclose(s[res["data"]], s[order[:25]], rtol=1e-5)
    # topK past the blocks: all of them; a non-contiguous float32 query: converted.
    t = kv.AsyncRetrieveByCPU(q.float().transpose(0, 1).contiguous().transpose(0, 1), r, idx, 500, 0, kv.CPU)
    assert kv.Wait(t) == 0 and sorted(kv.GetTaskResult(t)["data"]) == list(range(120))


def test_kvstar_bad_calls_fail_their_task():
    q = torch.zeros(1, 6, 8).half()
    for r, idx, k, msg in [
        (torch.zeros(5, 2, 4, 8).half(), None, 3, "not a multiple"),
        (torch.zeros(5, 2, 2, 4).half(), None, 3, "no dPrunedIndex"),
        (torch.zeros(5, 2, 2, 4).half(), torch.tensor([[0, 1, 2, 8], [0, 1, 2, 3]]), 3, "dPrunedIndex[0, 3] = 8"),
        (torch.zeros(5, 2, 2, 4).half(), torch.zeros(3, 4, dtype=torch.int64), 3, "dPrunedIndex of shape"),
        (torch.zeros(5, 2, 2, 8).half(), None, -1, "topK -1"),
        (torch.zeros(5, 2, 8).half(), None, 3, "want 4"),
    ]:
        t = kv.AsyncRetrieveByCPU(q, r, idx, k, 0, kv.CPU)
        res = kv.GetTaskResult(t)
        assert res["status"] == "FAILURE" and msg in res["error"], (msg, res)
        assert kv.Wait(t) == -1 and kv.Wait(t) == -50003
    assert kv.GetTaskResult(10 ** 12) is None
    with pytest.raises(ValueError):
        kv.Setup(kv.SetupParam([0], [], kv.CPU, 1, 0))


def gsa_ref(q, kpre, start, n, k, kvh):
    """UCM's selection for one request: float64 means and dots (exact on small integers)."""
    qh, d = q.shape
    g = qh // kvh
    qm = q.astype(np.float64).reshape(kvh, g, d).mean(1)
    blocks = kpre[start:start + n, 0].astype(np.float64)  # [n, kv, d]
    s = (blocks * qm).sum(-1).sum(-1)
    if n == 0 or k == 0:
        return []
    if 3 >= n or k >= n:
        return list(range(n))
    mid = sorted(range(1, n - 2), key=lambda i: (-s[i], i))
    return [0, n - 2, n - 1] + mid[:max(k - 3, 0)]


def test_gsa_against_reference():
    layers, qh, kvh, d, maxbs, slots, width = 3, 16, 4, 32, 4, 200, 30
    rng = np.random.default_rng(3)
    kpre = [torch.from_numpy(rng.integers(-1, 2, (slots, 1, kvh, d)).astype(np.float32)) for _ in range(layers)]
    q = torch.from_numpy(rng.integers(-2, 3, (layers, maxbs, qh, d)).astype(np.float32))
    op = CalKpreAndTopk(layers, 16, maxbs, qh, d)
    op.set_kpre_method_param(kvh, 1)
    op.set_kpre_cache(kpre)
    topk = [torch.full((maxbs, width), -7, dtype=torch.int32) for _ in range(layers)]
    mapping = [list(range(20, 60)), [1, 2], list(range(100, 125)), list(range(150, 170))]
    op.set_common_param([0, 2, 3], [True, False, True, True])
    op.set_topk_param(mapping)
    op.set_topk_cache(topk, [10, 25, 4])
    assert op.is_calculate_finish()
    for layer in range(layers):
        op.add_copy_req(False, layer, [0, -1, 2, 3], q[layer])
        if layer < layers - 1:
            assert not op.is_calculate_finish()  # the step has begun
    deadline = time.monotonic() + 30
    while not op.is_calculate_finish():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    g = qh // kvh
    for layer in range(layers):
        for i, j in [(0, 0), (2, 1), (3, 2)]:
            want = gsa_ref(q[layer][i].numpy(), kpre[layer].numpy(), mapping[i][0], len(mapping[i]),
                           [10, 25, 4][j], kvh)
            row = topk[layer][i].tolist()
            assert row[:len(want)] == want and set(row[len(want):]) == {-7}, (layer, i, row, want)
            # UCM's module leaves the group means in the query's first kv rows.
            mean = q[layer][i].reshape(kvh, g, d).sum(1) * np.float32(1 / g)
            assert torch.equal(op.q_cache[layer][i][:kvh], mean)
        assert set(topk[layer][1].tolist()) == {-7}  # not decoding
        assert torch.equal(op.q_cache[layer][1], torch.zeros(qh, d))  # location -1: not copied
    # A selection longer than its row is refused (UCM writes past it).
    op.set_topk_param(mapping)
    op.set_topk_cache([torch.zeros((maxbs, 5), dtype=torch.int32) for _ in range(layers)], [10, 25, 4])
    with pytest.raises(ValueError, match="selects 10 entries"):
        op.add_copy_req(False, 0, [0, -1, 2, 3], q[0])


def _gsa_step(op, layers, q, mapping):
    """One decode step of one request over mapping's slots; the layer-0 row of topk."""
    op.set_common_param([0], [True])
    op.set_topk_param([mapping])
    for layer in range(layers):
        op.add_copy_req(False, layer, [0], q[layer])
    deadline = time.monotonic() + 30
    while not op.is_calculate_finish():
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_gsa_bad_inputs_and_replaced_caches():
    layers, qh, kvh, d, slots = 2, 8, 2, 16, 40
    rng = np.random.default_rng(5)
    kpre = [torch.from_numpy(rng.integers(-1, 2, (slots, 1, kvh, d)).astype(np.float32)) for _ in range(layers)]
    q = torch.from_numpy(rng.integers(-2, 3, (layers, 1, qh, d)).astype(np.float32))
    topk = [torch.full((1, slots), -7, dtype=torch.int32) for _ in range(layers)]

    def fresh(kv_heads=kvh):
        op = CalKpreAndTopk(layers, 16, 1, qh, d)
        op.set_kpre_method_param(kv_heads, 1)
        op.set_kpre_cache(kpre)
        op.set_topk_cache(topk, [6])
        return op

    # Slots past the layer's kpre cache, or before it, are refused before anything is read.
    for mapping, match in [(list(range(30, 45)), r"repre_slot_mapping\[0\]: slots 30 … 44: outside kpre_caches\[0\]'s 40"),
                           (list(range(-2, 5)), r"repre_slot_mapping\[0\]: slot -2")]:
        op = fresh()
        op.set_common_param([0], [True])
        op.set_topk_param([mapping])
        with pytest.raises(ValueError, match=match):
            op.add_copy_req(False, 0, [0], q[0])
    # Query heads that are no whole multiple of the KV heads.
    op = fresh(kv_heads=3)
    op.set_common_param([0], [True])
    op.set_topk_param([list(range(10))])
    with pytest.raises(ValueError, match="8 query heads over 3 KV heads"):
        op.add_copy_req(False, 0, [0], q[0])
    # A kpre tensor given new storage in place between steps is read where it is now.
    op = fresh()
    _gsa_step(op, layers, q, list(range(slots)))
    first = topk[1][0].tolist()
    assert first[:6] == gsa_ref(q[1][0].numpy(), kpre[1].numpy(), 0, slots, 6, kvh)
    kpre[1].set_(torch.from_numpy(-kpre[1].numpy().copy()))
    _gsa_step(op, layers, q, list(range(slots)))
    again = topk[1][0].tolist()
    assert again[:6] == gsa_ref(q[1][0].numpy(), kpre[1].numpy(), 0, slots, 6, kvh)
    assert again[:6] != first[:6]
