#!/usr/bin/python3
"""Decodes the small model (train.py's PyTorch definition and weights/model.ucmw) with sparse
attention chosen through ucmgo's Python API, and reports top-1 agreement with dense decoding.

    make lib && /usr/bin/python3 lab/model/decode_ucmgo.py [--windows 8] [--budget 0.3]

The set-up is `ucm-lab eval sparse`'s (docs/sparse.md, "Quality on the small model"), so that
the two can be compared: train.py's held-out split of $(go env GOROOT)/src, split a's windows
of 1,025 bytes; each window's first 768 tokens are prefilled densely, then tokens 768…1023 are
decoded one at a time, teacher-forced; 16-token blocks; ESA with head_score softmax and
head_select kv at a budget of 30 % of the blocks (windows of 1 initial and 2 local blocks
included); layer 0 dense (--dense-layers 0).

What goes through ucmgo, as an inference engine would do it:

1. Prefill: the prompt's full blocks are stored (UcmGoStore.dump, one call per layer, K and V
   of the layer as the shard's two tensors) with ids from ucmgo.RequestHasher, and their
   representations are computed from the same K by the library (Selector.dump_reprs).
2. The store is closed and opened again (a new instance: what survives a restart), and the
   prefix's K/V are loaded from it (UcmGoStore.load) into the decode cache.
3. Every decode step of every sparse layer asks Selector.select(per_head=True) which blocks
   each KV head attends (the representations read from the store by block id), and attends
   those only; a block that decoding fills is stored with its representation at once.

The dense reference decodes the same windows over the same fp16 cache with every block.
"""

import argparse
import math
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "connector", "python"))

import train  # noqa: E402  (re-executes with OpenBLAS when Debian has it, as train.py does)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ucmgo import RequestHasher, UcmGoStore  # noqa: E402
from ucmgo.sparse import Selector  # noqa: E402


def fp16(t):
    return t.half().float()


class Decoder:
    """train.Model's forward one token at a time over a KV cache ([ctx][kv heads][head dim] per
    layer, fp16 values), attention restricted per KV head to allowed token masks."""

    def __init__(self, model, cfg):
        self.m, self.cfg = model, cfg
        self.g = cfg.n_heads // cfg.n_kv_heads

    def qkv(self, b, x, pos):
        cfg = self.cfg
        h = b.attn_norm(x)
        q = b.wq(h).view(cfg.n_heads, cfg.head_dim)
        k = b.wk(h).view(cfg.n_kv_heads, cfg.head_dim)
        v = b.wv(h).view(cfg.n_kv_heads, cfg.head_dim)
        cos, sin = self.m.cos[pos], self.m.sin[pos]
        q = q * cos + train.rotate_half(q) * sin
        k = k * cos + train.rotate_half(k) * sin
        return q, fp16(k), fp16(v)

    def finish(self, b, x, q, K, V, n, allowed):
        """x after attention over K[:n], V[:n] (allowed: None, or a bool [kv heads][n] mask)
        and the MLP."""
        cfg, g = self.cfg, self.g
        qg = q.view(cfg.n_kv_heads, g, cfg.head_dim) / math.sqrt(cfg.head_dim)
        att = torch.einsum("kgd,nkd->kgn", qg, K[:n])
        if allowed is not None:
            att = att.masked_fill(~allowed[:, None, :], float("-inf"))
        o = torch.einsum("kgn,nkd->kgd", att.softmax(-1), V[:n]).reshape(-1)
        x = x + b.wo(o)
        h = b.ffn_norm(x)
        return x + b.w_down(torch.nn.functional.silu(b.w_gate(h)) * b.w_up(h))

    def prefill(self, tokens):
        """Dense prefill of tokens: per layer K and V, [T][kv heads][head dim] (fp16 values)."""
        cfg = self.cfg
        T = len(tokens)
        x = self.m.embed(torch.tensor(tokens))
        Ks, Vs = [], []
        cos, sin = self.m.cos[:T], self.m.sin[:T]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        for b in self.m.layers:
            h = b.attn_norm(x)
            q = b.wq(h).view(T, cfg.n_heads, cfg.head_dim)
            k = b.wk(h).view(T, cfg.n_kv_heads, cfg.head_dim)
            v = b.wv(h).view(T, cfg.n_kv_heads, cfg.head_dim)
            q = q * cos[:, None] + train.rotate_half(q) * sin[:, None]
            k = fp16(k * cos[:, None] + train.rotate_half(k) * sin[:, None])
            v = fp16(v)
            Ks.append(k)
            Vs.append(v)
            qg = q.view(T, cfg.n_kv_heads, self.g, cfg.head_dim) / math.sqrt(cfg.head_dim)
            att = torch.einsum("tkgd,skd->kgts", qg, k).masked_fill(~causal, float("-inf"))
            o = torch.einsum("kgts,skd->tkgd", att.softmax(-1), v).reshape(T, -1)
            x = x + b.wo(o)
            hh = b.ffn_norm(x)
            x = x + b.w_down(torch.nn.functional.silu(b.w_gate(hh)) * b.w_up(hh))
        return Ks, Vs


def block_kv(K, V, i, bs):
    """Block i's K and V of one layer as the shard's two tensors (fp16, contiguous)."""
    return [K[i * bs:(i + 1) * bs].half().contiguous().view(-1), V[i * bs:(i + 1) * bs].half().contiguous().view(-1)]


def store_blocks(store, sel, ids, first, Ks, Vs, bs):
    """Stores blocks first… of ids (every layer's K and V) and their representations."""
    idx = list(range(first, len(ids)))
    if not idx:
        return
    bids = [ids[i] for i in idx]
    for l in range(len(Ks)):
        store.wait(store.dump(bids, [l] * len(bids), [block_kv(Ks[l], Vs[l], i, bs) for i in idx]))
    k = torch.stack([torch.stack([Ks[l][i * bs:(i + 1) * bs] for l in range(len(Ks))]) for i in idx]).half()
    store.wait(sel.dump_reprs(bids, k))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=os.path.join(HERE, "weights", "model.ucmw"))
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=768)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--budget", type=float, default=0.3)
    ap.add_argument("--dense-layers", type=int, nargs="*", default=[0])
    ap.add_argument("--dir", default="", help="the store's directory (default: a temporary one)")
    ap.add_argument("--goroot", default="")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)

    model, cfg = train.load_weights(args.weights)
    model.eval()
    corpus = argparse.Namespace(goroot=args.goroot, max_file_bytes=256 * 1024, heldout_permille=20)
    _, he, _, info = train.load_corpus(corpus)
    windows = train.heldout_windows(he, cfg.max_ctx, args.windows).tolist()
    bs, P, L = args.block_tokens, args.prefill, cfg.n_layers
    tensor = bs * cfg.n_kv_heads * cfg.head_dim * 2
    dirname = args.dir or tempfile.mkdtemp(prefix="ucmgo-decode-")
    store_cfg = {"storage_backends": dirname, "device_id": 0, "tensor_size_list": [tensor, tensor],
                 "shard_size": 2 * tensor, "block_size": 2 * tensor * L}
    sparse_cfg = {"ESA": {"budget": args.budget, "init_window_sz": 1, "local_window_sz": 2,
                          "head_select": "kv", "head_score": "softmax"}}
    shape = {"layers": L, "q_heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "block_size": bs}
    hasher = RequestHasher(model="ucm-small", tp_size=1, dtype="torch.float16")
    dec = Decoder(model, cfg)
    print("text: held-out split of %s (%d files, %d bytes), %d windows of %d bytes" % (
        info["goroot"], info["heldout_files"], info["heldout_bytes"], len(windows), cfg.max_ctx + 1))
    print("store: %s; selector: %s, shape %s" % (dirname, sparse_cfg, shape))

    # 1. Prefill every window and store its full blocks with their representations.
    t0 = time.time()
    prefix = []
    with UcmGoStore(store_cfg) as store, Selector(store, sparse_cfg, shape) as sel:
        for w in windows:
            Ks, Vs = dec.prefill(w[:P])
            ids = hasher.block_ids(w[:P], bs)
            store_blocks(store, sel, ids, 0, Ks, Vs, bs)
            prefix.append((ids, Ks, Vs))
    print("prefill and store: %.1f s" % (time.time() - t0))

    # 2.–3. A new store instance: the prefix from the store, selections per step.
    agree = total = 0
    units = attended = 0
    nll_dense = nll_sparse = 0.0
    t_sel = 0.0
    n_sel = 0
    t0 = time.time()
    with UcmGoStore(store_cfg) as store, Selector(store, sparse_cfg, shape) as sel:
        for wi, w in enumerate(windows):
            ids, Kd, Vd = prefix[wi]
            ids = list(ids)
            assert all(store.lookup(ids))
            # The prefix's K/V loaded from the store into the sparse run's cache.
            Ks = [torch.zeros(cfg.max_ctx, cfg.n_kv_heads, cfg.head_dim) for _ in range(L)]
            Vs = [torch.zeros(cfg.max_ctx, cfg.n_kv_heads, cfg.head_dim) for _ in range(L)]
            for l in range(L):
                dst = [[torch.empty(tensor // 2, dtype=torch.float16), torch.empty(tensor // 2, dtype=torch.float16)] for _ in ids]
                store.wait(store.load(ids, [l] * len(ids), dst))
                for i, (kb, vb) in enumerate(dst):
                    Ks[l][i * bs:(i + 1) * bs] = kb.view(bs, cfg.n_kv_heads, cfg.head_dim).float()
                    Vs[l][i * bs:(i + 1) * bs] = vb.view(bs, cfg.n_kv_heads, cfg.head_dim).float()
            assert all(torch.equal(Ks[l][:P], Kd[l]) for l in range(L)), "the prefix loaded differs from the one stored"
            # The dense run's cache: the same prefix.
            KD = [k.clone() for k in Ks]
            VD = [v.clone() for v in Vs]
            req = "w%d" % wi
            for p in range(P, cfg.max_ctx):
                step = p - P
                tok, target = w[p], w[p + 1]
                xs = xd = model.embed(torch.tensor(tok))
                for l, b in enumerate(model.layers):
                    qd, kd, vd = dec.qkv(b, xd, p)
                    KD[l][p], VD[l][p] = kd, vd
                    xd = dec.finish(b, xd, qd, KD[l], VD[l], p + 1, None)
                    q, k, v = dec.qkv(b, xs, p)
                    Ks[l][p], Vs[l][p] = k, v
                    n_blocks = (p + bs) // bs
                    units += n_blocks * cfg.n_kv_heads
                    if l in args.dense_layers:
                        attended += n_blocks * cfg.n_kv_heads
                        xs = dec.finish(b, xs, q, Ks[l], Vs[l], p + 1, None)
                        continue
                    ts = time.perf_counter()
                    _, heads = sel.select(req, l, step, q, ids, p + 1, per_head=True)
                    t_sel += time.perf_counter() - ts
                    n_sel += 1
                    allowed = torch.zeros(cfg.n_kv_heads, p + 1, dtype=torch.bool)
                    for h, blocks in enumerate(heads):
                        attended += len(blocks)
                        for blk in blocks.tolist():
                            allowed[h, blk * bs:(blk + 1) * bs] = True
                    allowed[:, (p // bs) * bs:] = True  # the current block, always
                    xs = dec.finish(b, xs, q, Ks[l], Vs[l], p + 1, allowed)
                ld = model.lm_head(model.norm(xd))
                ls = model.lm_head(model.norm(xs))
                agree += int(ld.argmax() == ls.argmax())
                total += 1
                nll_dense -= float(ld.log_softmax(-1)[target])
                nll_sparse -= float(ls.log_softmax(-1)[target])
                if (p + 1) % bs == 0:  # decoding filled a block: store it with its representation
                    ids = hasher.block_ids(w[:p + 1], bs)
                    store_blocks(store, sel, ids, len(ids) - 1, Ks, Vs, bs)
            sel.request_finished(req)
            print("window %d: top-1 agreement so far %.2f %% (%d/%d)" % (wi, 100.0 * agree / total, agree, total), flush=True)
    ppl_d, ppl_s = math.exp(nll_dense / total), math.exp(nll_sparse / total)
    print("decode: %.1f s; %d selections, %.0f us each through Python (ctypes) on average" % (
        time.time() - t0, n_sel, 1e6 * t_sel / max(n_sel, 1)))
    print("top-1 agreement with dense: %.2f %% (%d of %d positions)" % (100.0 * agree / total, agree, total))
    print("perplexity: dense %.3f, sparse %.3f (%+.2f %%)" % (ppl_d, ppl_s, 100.0 * (ppl_s / ppl_d - 1)))
    print("attended: %.1f %% of the (block, layer, KV head) units (budget %.0f %% nominal, layers %s dense)" % (
        100.0 * attended / units, 100 * args.budget, args.dense_layers))


if __name__ == "__main__":
    main()
