#!/usr/bin/env python3
"""Generate connector/ucmhash/testdata/hasher/vectors.json for connector/ucmhash/hasher_test.go.

Reproduces UCM's RequestHasher (ucm/integration/vllm/ucm_connector.py) with the standard library
only (hashlib + pickle, protocol pickle.HIGHEST_PROTOCOL == 5 on CPython 3.8+):

    meta = f"{model}:{tp_size}:{dtype}:{rank_id}"
    hasher(x) = md5(meta_bytes + (x if bytes else pickle.dumps(x, HIGHEST_PROTOCOL))).digest()
    seed = hasher("UCM_HASH_SEED")
    block_hash[i] = hasher((parent_hash_bytes, tuple(block_token_ids)))   # parent of block 0: seed
    rank re-hash (non-MLA TP rank r != 0): md5(meta_r_bytes + rank0_id)

Run from the repository root:  python3 connector/ucmhash/testdata/hasher/gen_vectors.py
"""
import hashlib
import json
import os
import pickle
import platform
import random


class RequestHasher:
    def __init__(self, model, tp_size, dtype, rank_id):
        self.meta_bytes = f"{model}:{tp_size}:{dtype}:{rank_id}".encode("utf-8")

    def __call__(self, x):
        if not isinstance(x, bytes):
            x = pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)
        return hashlib.md5(self.meta_bytes + x).digest()


def block_hashes(h, token_ids, block_size, parent):
    out = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = h((parent, tuple(token_ids[start:start + block_size])))
        out.append(parent)
    return out


EDGE = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1]


def pickle_vectors():
    vecs = []
    for s in ["UCM_HASH_SEED", "", "x" * 255, "x" * 256, "\u00e9" * 200, "\u4e2d\u6587"]:
        vecs.append({"kind": "str", "str": s, "hex": pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL).hex()})
    parent = bytes(range(16))
    token_cases = [[], [0], [255, 256], [1, 2, 3], [1, 2, 3, 4], [5, 5, 5, 5, 5], EDGE, EDGE[::-1]]
    token_cases += [[v] for v in EDGE] + [[v, v] for v in EDGE] + [[v] * 3 for v in EDGE]
    for toks in token_cases:
        d = pickle.dumps((parent, tuple(toks)), protocol=pickle.HIGHEST_PROTOCOL)
        vecs.append({"kind": "block", "parent": parent.hex(), "tokens": toks, "hex": d.hex()})
    # Large tuples: exercise FRAME splitting at 64 KiB (CPython commits a frame before saving an
    # object once the frame holds >= 65536 bytes). Given as (value, count) with length + md5.
    for value, count in [(2**32 - 1, 1024), (2**32 - 1, 9359), (2**32 - 1, 9360), (2**32 - 1, 9361),
                         (7, 32757), (7, 32758), (7, 32759), (7, 32760), (300, 70000),
                         (2**32 - 1, 30000)]:
        d = pickle.dumps((parent, tuple([value] * count)), protocol=pickle.HIGHEST_PROTOCOL)
        vecs.append({"kind": "block_repeat", "parent": parent.hex(), "value": value, "count": count,
                     "len": len(d), "md5": hashlib.md5(d).hexdigest()})
    # Mixed values, deterministic formula reproduced by the Go test (no token list in the JSON).
    count = 20000
    toks = [EDGE[i % len(EDGE)] if i % 3 == 0 else (i * 2654435761 + 12345) % 2**32 for i in range(count)]
    d = pickle.dumps((parent, tuple(toks)), protocol=pickle.HIGHEST_PROTOCOL)
    vecs.append({"kind": "block_formula", "parent": parent.hex(), "count": count,
                 "len": len(d), "md5": hashlib.md5(d).hexdigest()})
    return vecs


def chain_vectors():
    rnd = random.Random(20240611)
    metas = [
        ("Qwen/Qwen2.5-7B-Instruct", 1, "bfloat16", 0),
        ("deepseek-ai/DeepSeek-V3", 8, "bfloat16", 0),
        ("meta-llama/Llama-3.1-70B", 4, "float16", 2),
        ("\u6a21\u578b-\u00e9", 2, "float8_e4m3fn", 1),
        ("", 1, "", 0),
    ]
    chains = []
    for i, (model, tp, dtype, rank) in enumerate(metas):
        for block_size in (16, 64, 128):
            nblocks = 3
            tail = rnd.randrange(0, block_size)  # trailing partial block (ignored)
            n = nblocks * block_size + tail
            toks = [rnd.choice(EDGE) if rnd.random() < 0.3 else rnd.randrange(2**32 if i % 2 else 200000)
                    for _ in range(n)]
            h = RequestHasher(model, tp, dtype, rank)
            seed = h("UCM_HASH_SEED")
            ids = block_hashes(h, toks, block_size, seed)
            for_rank = []
            for r in sorted({0, 1, tp - 1, 7}):
                hr = RequestHasher(model, tp, dtype, r)
                # UCM: rank 0 keeps the id; other non-MLA ranks re-hash md5(meta_r + id).
                rids = ids if r == 0 else [hr(x) for x in ids]
                for_rank.append({"rank": r, "ids": [x.hex() for x in rids]})
            chains.append({
                "model": model, "tp_size": tp, "dtype": dtype, "rank": rank,
                "block_size": block_size, "tokens": toks,
                "seed": seed.hex(), "ids": [x.hex() for x in ids], "for_rank": for_rank,
            })
    # Short inputs: no full block at all.
    h = RequestHasher("m", 1, "bf16", 0)
    chains.append({"model": "m", "tp_size": 1, "dtype": "bf16", "rank": 0, "block_size": 16,
                   "tokens": list(range(15)), "seed": h("UCM_HASH_SEED").hex(), "ids": [],
                   "for_rank": []})
    return chains


def main():
    out = {
        "generator": "gen_vectors.py",
        "python": platform.python_version(),
        "pickle_protocol": pickle.HIGHEST_PROTOCOL,
        "pickle": pickle_vectors(),
        "chains": chain_vectors(),
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
