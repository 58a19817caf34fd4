#!/usr/bin/python3
"""Train UCM-Go's small real model: a byte-level Llama-architecture decoder on the Go standard
library's source, and write its fp16 weights, manifest and the Go test's golden fixture.

Run with Debian's python3 (torch 1.13, numpy; nothing else):

    nice -n 10 /usr/bin/python3 lab/model/train.py --steps 1800

Architecture (docs/model.md): token embedding (256 bytes) -> N x [RMSNorm -> GQA attention with
RoPE (NeoX half-split rotation as in HF Llama, theta 10000) -> residual; RMSNorm -> SwiGLU MLP
-> residual] -> final RMSNorm -> LM head (untied). Query head h reads KV head h // (H / KVH).

Corpus: every .go file under $(go env GOROOT)/src outside testdata directories and no larger
than --max-file-bytes, sorted by path; a file is held out when the first 8 bytes of
sha256(relative path), read as a big-endian integer, modulo 1000 are below --heldout-permille.
Files are concatenated in path order (no separator; Go files end in a newline).

Everything is deterministic given the arguments (seeded torch and numpy generators; 2 threads).
"""

import argparse
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import time

# Debian's torch links the reference BLAS (libblas3), ten times slower than OpenBLAS here. When
# Debian's libopenblas0-pthread is installed, run again with its BLAS first on the library path
# (without touching the system's BLAS alternative).
_OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread"
if os.path.isdir(_OPENBLAS) and os.environ.get("UCM_TRAIN_BLAS") is None:
    env = dict(os.environ, UCM_TRAIN_BLAS=_OPENBLAS, OPENBLAS_NUM_THREADS="2",
               LD_LIBRARY_PATH=_OPENBLAS + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
    os.execve(sys.executable, [sys.executable] + sys.argv, env)

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

MAGIC = b"UCMMODEL"
VERSION = 1
DTYPE_F16 = 1
ALIGN = 64


# ---------------------------------------------------------------------------------------------
# Corpus


def go_env(name):
    return subprocess.check_output(["go", "env", name], text=True).strip()


def list_corpus(goroot, max_file_bytes):
    src = os.path.join(goroot, "src")
    paths = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d != "testdata")
        for fn in filenames:
            if not fn.endswith(".go"):
                continue
            full = os.path.join(dirpath, fn)
            if os.path.islink(full) or os.path.getsize(full) > max_file_bytes:
                continue
            paths.append(os.path.relpath(full, src))
    paths.sort()
    return src, paths


def is_heldout(rel, permille):
    h = hashlib.sha256(rel.encode()).digest()
    return int.from_bytes(h[:8], "big") % 1000 < permille


def load_corpus(args):
    goroot = args.goroot or go_env("GOROOT")
    src, paths = list_corpus(goroot, args.max_file_bytes)
    train, held = [], []
    listing = hashlib.sha256()
    for rel in paths:
        with open(os.path.join(src, rel), "rb") as f:
            data = f.read()
        listing.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\n")
        (held if is_heldout(rel, args.heldout_permille) else train).append((rel, data))
    info = {
        "goroot": goroot,
        "go_version": subprocess.check_output([os.path.join(goroot, "bin", "go"), "version"], text=True).strip()
        if os.path.exists(os.path.join(goroot, "bin", "go")) else "unknown",
        "files": len(paths),
        "train_files": len(train),
        "heldout_files": len(held),
        "file_list_sha256": listing.hexdigest(),
        "file_list_hash_input": "sha256 over sorted 'relpath\\0size\\n' lines",
    }
    tr = np.frombuffer(b"".join(d for _, d in train), dtype=np.uint8)
    he = np.frombuffer(b"".join(d for _, d in held), dtype=np.uint8)
    info["train_bytes"] = int(tr.size)
    info["heldout_bytes"] = int(he.size)
    return tr, he, held, info


# ---------------------------------------------------------------------------------------------
# Model


class Config:
    def __init__(self, vocab=256, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, head_dim=32,
                 ffn_dim=704, max_ctx=1024, rope_theta=10000.0, norm_eps=1e-5):
        self.vocab = vocab
        self.d_model = d_model
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.ffn_dim = ffn_dim
        self.max_ctx = max_ctx
        self.rope_theta = rope_theta
        self.norm_eps = norm_eps

    def as_dict(self):
        return dict(self.__dict__)


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(cfg, n, device=None):
    half = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, dtype=torch.float64) * 2.0 / cfg.head_dim))
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.d_model, cfg.head_dim
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.wq = nn.Linear(d, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(d, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(d, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, d, bias=False)
        self.ffn_norm = RMSNorm(d, cfg.norm_eps)
        self.w_gate = nn.Linear(d, cfg.ffn_dim, bias=False)
        self.w_up = nn.Linear(d, cfg.ffn_dim, bias=False)
        self.w_down = nn.Linear(cfg.ffn_dim, d, bias=False)

    def forward(self, x, cos, sin, mask, kv_round=None):
        cfg = self.cfg
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = self.wk(h).view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.wv(h).view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if kv_round is not None:  # emulate an fp16 KV cache (K stored after RoPE, as vLLM does)
            k = kv_round(k)
            v = kv_round(v)
        # GQA without copying K/V: the G query heads sharing a KV head are stacked along the
        # sequence axis, so one batched matmul serves the whole group (query head h = kv*G + g).
        g = cfg.n_heads // cfg.n_kv_heads
        qg = (q * (1.0 / math.sqrt(cfg.head_dim))).reshape(B * cfg.n_kv_heads, g * T, cfg.head_dim)
        att = torch.baddbmm(mask, qg, k.reshape(B * cfg.n_kv_heads, T, cfg.head_dim).transpose(1, 2))
        att = att.softmax(-1)
        o = torch.bmm(att, v.reshape(B * cfg.n_kv_heads, T, cfg.head_dim))
        o = o.view(B, cfg.n_heads, T, cfg.head_dim).transpose(1, 2).reshape(B, T, cfg.n_heads * cfg.head_dim)
        x = x + self.wo(o)
        h = self.ffn_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        cos, sin = rope_tables(cfg, cfg.max_ctx)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.apply(self._init)
        std_out = 0.02 / math.sqrt(2 * cfg.n_layers)
        for b in self.layers:
            nn.init.normal_(b.wo.weight, std=std_out)
            nn.init.normal_(b.w_down.weight, std=std_out)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, kv_round=None):
        T = idx.shape[1]
        x = self.embed(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        g = self.cfg.n_heads // self.cfg.n_kv_heads
        mask = torch.full((T, T), float("-inf")).triu(1).repeat(g, 1)  # additive causal mask, per group row
        for b in self.layers:
            x = b(x, cos, sin, mask, kv_round)
        return self.lm_head(self.norm(x))


def tensor_names(cfg):
    """The weight file's tensors, in file order, with the module attribute they come from."""
    out = [("tok_embeddings", "embed.weight", (cfg.vocab, cfg.d_model))]
    hd = cfg.head_dim
    for i in range(cfg.n_layers):
        p = "layers.%d." % i
        out += [
            (p + "attention_norm", p + "attn_norm.weight", (cfg.d_model,)),
            (p + "wq", p + "wq.weight", (cfg.n_heads * hd, cfg.d_model)),
            (p + "wk", p + "wk.weight", (cfg.n_kv_heads * hd, cfg.d_model)),
            (p + "wv", p + "wv.weight", (cfg.n_kv_heads * hd, cfg.d_model)),
            (p + "wo", p + "wo.weight", (cfg.d_model, cfg.n_heads * hd)),
            (p + "ffn_norm", p + "ffn_norm.weight", (cfg.d_model,)),
            (p + "w_gate", p + "w_gate.weight", (cfg.ffn_dim, cfg.d_model)),
            (p + "w_up", p + "w_up.weight", (cfg.ffn_dim, cfg.d_model)),
            (p + "w_down", p + "w_down.weight", (cfg.d_model, cfg.ffn_dim)),
        ]
    out += [("norm", "norm.weight", (cfg.d_model,)), ("output", "lm_head.weight", (cfg.vocab, cfg.d_model))]
    return out


# ---------------------------------------------------------------------------------------------
# Weight file (docs/model.md has the byte diagram). All integers little-endian.
#
#   header (64 bytes):
#     0  magic "UCMMODEL"           8 bytes
#     8  version u32 (1)
#    12  vocab u32, d_model u32, n_layers u32, n_heads u32, n_kv_heads u32, head_dim u32,
#        ffn_dim u32, max_ctx u32                                                  (12..44)
#    44  rope_theta f32, norm_eps f32                                              (44..52)
#    52  flags u32 (bit 0: LM head tied to the embedding; never set by this script)
#    56  n_tensors u32
#    60  table_bytes u32 (bytes of the tensor table that follows)
#   tensor table, one entry per tensor:
#     name_len u16, name bytes, dtype u8 (1 = float16), ndim u8, dims u32 x ndim,
#     offset u64 (from the start of the file, a multiple of 64), nbytes u64
#   data: each tensor row-major at its offset, zero padding between.


def save_weights(model, cfg, path):
    sd = model.state_dict()
    entries = []
    for name, attr, shape in tensor_names(cfg):
        t = sd[attr].detach().to(torch.float16).contiguous()
        assert tuple(t.shape) == shape, (name, t.shape, shape)
        entries.append((name, t))
    def table(offsets):
        b = bytearray()
        for (name, t), off in zip(entries, offsets):
            nb = name.encode()
            b += struct.pack("<H", len(nb)) + nb + struct.pack("<BB", DTYPE_F16, t.dim())
            b += struct.pack("<%dI" % t.dim(), *t.shape)
            b += struct.pack("<QQ", off, t.numel() * 2)
        return bytes(b)
    tlen = len(table([0] * len(entries)))
    off = 64 + tlen
    offsets = []
    for _, t in entries:
        off = (off + ALIGN - 1) // ALIGN * ALIGN
        offsets.append(off)
        off += t.numel() * 2
    header = MAGIC + struct.pack("<I", VERSION)
    header += struct.pack("<8I", cfg.vocab, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
                          cfg.head_dim, cfg.ffn_dim, cfg.max_ctx)
    header += struct.pack("<ff", cfg.rope_theta, cfg.norm_eps)
    header += struct.pack("<III", 0, len(entries), tlen)
    assert len(header) == 64
    buf = bytearray(header + table(offsets))
    for (_, t), o in zip(entries, offsets):
        buf += b"\0" * (o - len(buf))
        buf += t.numpy().astype("<f2").tobytes()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(buf)
    os.replace(tmp, path)
    return hashlib.sha256(buf).hexdigest(), len(buf)


def load_weights(path):
    with open(path, "rb") as f:
        buf = f.read()
    assert buf[:8] == MAGIC
    ver, = struct.unpack_from("<I", buf, 8)
    assert ver == VERSION
    v = struct.unpack_from("<8I", buf, 12)
    theta, eps = struct.unpack_from("<ff", buf, 44)
    flags, n, tlen = struct.unpack_from("<III", buf, 52)
    cfg = Config(*v, rope_theta=theta, norm_eps=eps)
    p = 64
    tensors = {}
    for _ in range(n):
        ln, = struct.unpack_from("<H", buf, p); p += 2
        name = buf[p:p + ln].decode(); p += ln
        dt, nd = struct.unpack_from("<BB", buf, p); p += 2
        dims = struct.unpack_from("<%dI" % nd, buf, p); p += 4 * nd
        off, nb = struct.unpack_from("<QQ", buf, p); p += 16
        a = np.frombuffer(buf, dtype="<f2", count=nb // 2, offset=off).reshape(dims)
        tensors[name] = torch.from_numpy(a.astype(np.float32))
    model = Model(cfg)
    sd = model.state_dict()
    for name, attr, _ in tensor_names(cfg):
        sd[attr].copy_(tensors[name])
    return model, cfg


# ---------------------------------------------------------------------------------------------
# Training and evaluation


def heldout_windows(he, ctx, n):
    """n fixed windows of ctx+1 bytes spread evenly over the held-out stream."""
    span = he.size - (ctx + 1)
    starts = [int(i * span / max(1, n - 1)) for i in range(n)]
    return torch.from_numpy(np.stack([he[s:s + ctx + 1] for s in starts]).astype(np.int64))


@torch.no_grad()
def evaluate(model, windows, bs=8):
    model.eval()
    tot, cnt = 0.0, 0
    for i in range(0, windows.shape[0], bs):
        w = windows[i:i + bs]
        logits = model(w[:, :-1])
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum").item()
        cnt += w[:, 1:].numel()
    model.train()
    return tot / cnt


def unigram_baselines(tr, he):
    ct = np.bincount(tr, minlength=256).astype(np.float64) + 1.0  # add-one smoothing
    pt = ct / ct.sum()
    ch = np.bincount(he, minlength=256).astype(np.float64)
    ph = ch / ch.sum()
    nz = ph > 0
    own = float(-(ph[nz] * np.log(ph[nz])).sum())
    cross = float(-(ph[nz] * np.log(pt[nz])).sum())
    return {"heldout_unigram_entropy_nats": own, "train_unigram_cross_entropy_nats": cross}


def progress(step, elapsed, args):
    """Fraction of the schedule done: by steps, or by wall time when --max-minutes is set
    (whichever is further), so that a run on a busy machine still completes its cosine decay."""
    p = step / max(1, args.steps)
    if args.max_minutes:
        p = max(p, elapsed / (60.0 * args.max_minutes))
    return min(1.0, p)


def lr_at(step, elapsed, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = progress(step, elapsed, args)
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def golden(model, cfg, held, args, path):
    """Fixture for the Go test: a prompt from a held-out file and the logits of its last positions."""
    # the first held-out file long enough, past its license header
    rel, data = next((r, d) for r, d in held if len(d) >= 1024 + args.golden_prompt)
    prompt = data[1024:1024 + args.golden_prompt]
    idx = torch.tensor([list(prompt)], dtype=torch.int64)
    r16 = lambda t: t.to(torch.float16).to(torch.float32)
    with torch.no_grad():
        model.eval()
        l32 = model(idx)[0]
        l16 = model(idx, kv_round=r16)[0]
        # greedy continuation with the fp16-KV model
        gen = list(prompt)
        for _ in range(args.golden_gen):
            nxt = int(model(torch.tensor([gen]), kv_round=r16)[0, -1].argmax())
            gen.append(nxt)
    last = args.golden_last
    pos = list(range(len(prompt) - last, len(prompt)))
    out = {
        "source_file": rel,
        "prompt_hex": prompt.hex(),
        "positions": pos,
        "logits_fp32_kv": [[float(x) for x in l32[p]] for p in pos],
        "logits_fp16_kv": [[float(x) for x in l16[p]] for p in pos],
        "greedy_fp16_kv_hex": bytes(gen[len(prompt):]).hex(),
        "note": "PyTorch forward of the fp16 weights cast to fp32; fp16_kv rounds K (after RoPE) and V to fp16",
    }
    with open(path, "w") as f:
        json.dump(out, f)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--ffn", type=int, default=704)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--short-ctx", type=int, default=0,
                    help="train at this shorter context (batch scaled to the same bytes per step) "
                         "until the last --long-frac of the schedule, then at --ctx")
    ap.add_argument("--long-frac", type=float, default=0.2)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--goroot", default="")
    ap.add_argument("--max-file-bytes", type=int, default=256 * 1024)
    ap.add_argument("--heldout-permille", type=int, default=20)
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--out", default=os.path.join(HERE, "weights"))
    ap.add_argument("--testdata", default=os.path.join(HERE, "testdata"))
    ap.add_argument("--golden-prompt", type=int, default=300)
    ap.add_argument("--golden-last", type=int, default=8)
    ap.add_argument("--golden-gen", type=int, default=48)
    ap.add_argument("--max-minutes", type=float, default=0,
                    help="wall-time budget: the cosine schedule runs on max(step/steps, elapsed/budget) and "
                         "training stops when either is done (steps done are recorded in the manifest)")
    ap.add_argument("--bench", type=int, default=0, help="only time this many training steps")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    tr, he, held, corpus = load_corpus(args)
    print("corpus:", json.dumps(corpus), "(%.1fs)" % (time.time() - t0), flush=True)

    cfg = Config(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, n_kv_heads=args.kv_heads,
                 head_dim=args.head_dim, ffn_dim=args.ffn, max_ctx=args.ctx)
    model = Model(cfg)
    nparams = sum(p.numel() for p in model.parameters())
    print("config:", json.dumps(cfg.as_dict()), "params:", nparams, flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": nodecay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    steps = args.bench or args.steps
    L = args.ctx + 1
    t_train = time.time()
    ema = None
    steps_done = 0
    long_from = None
    for step in range(steps):
        lr = lr_at(step, time.time() - t_train, args)
        for g in opt.param_groups:
            g["lr"] = lr
        ctx, batch = args.ctx, args.batch
        if args.short_ctx and progress(step, time.time() - t_train, args) < 1 - args.long_frac:
            ctx, batch = args.short_ctx, args.batch * args.ctx // args.short_ctx
        elif args.short_ctx and long_from is None:
            long_from = step
            print("step %d: context %d from here on" % (step, ctx), flush=True)
        L = ctx + 1
        starts = rng.integers(0, tr.size - L, size=batch)
        xb = torch.from_numpy(np.stack([tr[s:s + L] for s in starts]).astype(np.int64))
        logits = model(xb[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        li = loss.item()
        steps_done = step + 1
        ema = li if ema is None else 0.95 * ema + 0.05 * li
        el = time.time() - t_train
        done = not args.bench and progress(steps_done, el, args) >= 1.0
        if step % args.log_every == 0 or step == steps - 1 or done:
            tok = steps_done * args.batch * args.ctx
            print("step %d/%d loss %.4f (ema %.4f, %.3f bits/byte) lr %.2e  %.0fs  %.0f tok/s" % (
                step, steps, li, ema, ema / math.log(2), lr, el, tok / el), flush=True)
        if done:
            break
    train_wall = time.time() - t_train
    if args.bench:
        print("bench: %.1f tok/s" % (steps * args.batch * args.ctx / train_wall))
        return

    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.testdata, exist_ok=True)
    wpath = os.path.join(args.out, "model.ucmw")
    sha, size = save_weights(model, cfg, wpath)
    # Evaluate what was saved: the fp16 weights, cast back to fp32.
    m16, _ = load_weights(wpath)
    windows = heldout_windows(he, args.ctx, args.eval_windows)
    t_eval = time.time()
    held_loss = evaluate(m16, windows)
    train_windows = heldout_windows(tr, args.ctx, args.eval_windows)
    train_loss = evaluate(m16, train_windows[:32])
    base = unigram_baselines(tr, he)
    print("held-out loss %.4f nats/byte (%.4f bits/byte); train sample %.4f; unigram %s (eval %.0fs)" % (
        held_loss, held_loss / math.log(2), train_loss, base, time.time() - t_eval), flush=True)
    golden(m16, cfg, held, args, os.path.join(args.testdata, "golden.json"))

    manifest = {
        "weights_file": "model.ucmw",
        "weights_sha256": sha,
        "weights_bytes": size,
        "format": "UCMMODEL v1 (docs/model.md)",
        "training_command": ("nice -n %d " % os.nice(0) if os.nice(0) > 0 else "") +
                            "/usr/bin/python3 lab/model/train.py " + " ".join(sys.argv[1:]),
        "args": vars(args),
        "config": cfg.as_dict(),
        "parameters": nparams,
        "corpus": corpus,
        "torch": torch.__version__,
        "blas": os.environ.get("UCM_TRAIN_BLAS", "reference"),
        "train_steps_done": steps_done,
        "train_tokens_seen": steps_done * args.batch * args.ctx,
        "train_steps_at_full_context": steps_done - (long_from if long_from is not None else 0),
        "train_wall_seconds": round(train_wall, 1),
        "heldout_eval": {
            "windows": args.eval_windows,
            "window_bytes": args.ctx,
            "predicted_bytes": int(windows.shape[0] * args.ctx),
            "loss_nats_per_byte": held_loss,
            "loss_bits_per_byte": held_loss / math.log(2),
            "train_sample_loss_nats_per_byte": train_loss,
        },
        "baselines": base,
    }
    with open(os.path.join(args.out, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    print("wrote", wpath, size, "bytes, sha256", sha, flush=True)


if __name__ == "__main__":
    main()
