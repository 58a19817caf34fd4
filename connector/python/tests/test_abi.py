"""The ABI's edges from Python: impossible arguments, OS errors, os.environ at open, non-BMP
paths, UCM's whole-block (PcStore) form."""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import ucmgo
from helpers import K, LAYERS, SHARD, Slab, expected, layerwise_config, random_ids
from test_store import dump_layerwise, expect_error
from ucmgo import UcmGoError, UcmGoStore

PYDIR = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

# Run in a child process: without the checks these calls abort the interpreter (the Go
# runtime's "unsafe.Slice: len out of range"), which must fail this test, not end the run.
IMPOSSIBLE = r'''
import sys
import numpy as np
import ucmgo
from helpers import K, LAYERS, SHARD, Slab, expected, layerwise_config, random_ids
from test_store import dump_layerwise
from ucmgo import UcmGoError, UcmGoStore

store = UcmGoStore(layerwise_config(sys.argv[1]))
ids = random_ids(2)
slab = Slab(2 * SHARD)
dump_layerwise(store, ids, slab)
calls = [
    ("address -5", store.dump_data, ids[:1], [0], np.array([[-5, 1]], np.int64), "address 0: 32768 bytes at 0xfffffffffffffffb"),
    ("address 2**64-4096", store.dump_data, ids[:1], [0], [[slab.base, 2 ** 64 - 4096]], "address 1: 32768 bytes at 0xfffffffffffff000"),
    ("address in the first page", store.load_data, ids[:1], [0], [[16]], "address 0: 65536 bytes at 0x10"),
    ("address 2**56", store.load_data, ids, [0, 0], np.array([[slab.base, slab.base + K], [2 ** 56, slab.base]], np.uint64), "block at position 1, address 0"),
    ("whole block at 2**64-4096", store.dump_data, ids[:1], [], [[2 ** 64 - 4096]], "bytes at 0xfffffffffffff000"),
    ("33 blocks, one impossible address", store.load_data, ids[:1] * 33, [0] * 33, [[slab.base]] * 32 + [[2 ** 63]], "position 32"),
]
for name, fn, *args, words in calls:
    try:
        fn(*args)
    except UcmGoError as e:
        assert e.status == ucmgo.EPARAM, (name, e.status, str(e))
        assert words in str(e), (name, words, str(e))
    else:
        raise AssertionError("%s: accepted" % name)
# The store still works: every layer of both blocks loads back.
for layer in range(LAYERS):
    slab.zero()
    store.wait(store.load_data(ids, [layer, layer], [[slab.base], [slab.base + SHARD]]))
    for i, bid in enumerate(ids):
        assert slab.read(i * SHARD, SHARD) == expected(bid, layer, SHARD), (layer, i)
store.close()
print("ok")
'''


def run_child(script, *args, **kw):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PYDIR), str(TESTS)]))
    return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=120, **kw)


def test_impossible_arguments_are_eparam_and_the_process_survives(backend):
    """Addresses no caller's memory can have (-5, 2**64 - 4096, the first page, 2**56), as UCM's
    callers pass them in lists and numpy arrays, through the queued path and Go's: EPARAM naming
    the block and address; the process lives on and the store still loads what it holds."""
    r = run_child(IMPOSSIBLE, backend)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout, r.stderr[-3000:])


def test_os_errors_are_eoserror(tmp_path):
    """A storage_backends the file system refuses is UCM's EOSERROR: under a regular file
    (ENOTDIR), and under a directory without write permission (EACCES, as an unprivileged user)."""
    f = tmp_path / "file"
    f.write_bytes(b"")
    expect_error(ucmgo.EOSERROR, [str(f)], UcmGoStore, layerwise_config(str(f / "ucm")))
    top = Path(tempfile.mkdtemp(prefix="ucmgo-perm-"))
    try:
        locked = top / "locked"
        locked.mkdir()
        os.chmod(top, 0o755)
        os.chmod(locked, 0o555)
        script = (
            "import sys, ucmgo\n"
            "from helpers import layerwise_config\n"
            "try:\n"
            "    ucmgo.UcmGoStore(layerwise_config(sys.argv[1]))\n"
            "except ucmgo.UcmGoError as e:\n"
            "    print(e.status, e)\n"
        )
        kw = {}
        if os.geteuid() == 0:  # root ignores permissions: the child runs as nobody
            kw = {"user": 65534, "group": 65534, "cwd": "/"}
        r = run_child(script, str(locked / "ucm"), **kw)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.startswith(str(ucmgo.EOSERROR)) and "permission denied" in r.stdout, r.stdout + r.stderr[-2000:]
    finally:
        shutil.rmtree(top, ignore_errors=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ENVIRON = r'''
import os, sys
from pathlib import Path
import ucmgo
from ucmgo import UcmGoError, UcmGoStore

backend, cfg, other, port = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
ucmgo._lib.get()  # the library loaded: the Go runtime has its copy of the environment
os.environ["UCM_CONFIG_FILE"] = cfg
os.environ["UCM_STORAGE_PATH"] = str(other)
os.environ["UCM_METRICS_ENABLE"] = "true"
os.environ["UCM_METRICS_PORT"] = str(port - 1)  # + 1 + device_id
with UcmGoStore({}) as store:
    st = store.stats()
    assert st["layout"]["ShardBytes"] == int(sys.argv[5]), st["layout"]
    assert st.get("metrics_address") == "127.0.0.1:%d" % port, st.get("metrics_address")
    assert (other / "stores").is_dir() and not (Path(backend) / "stores").exists()
del os.environ["UCM_CONFIG_FILE"]
try:
    UcmGoStore({})
except UcmGoError as e:
    assert e.status == ucmgo.EPARAM and "UCM_CONFIG_FILE is not set" in str(e), str(e)
else:
    raise AssertionError("opened without UCM_CONFIG_FILE")
print("ok")
'''


def test_environ_changes_after_import_count(backend, tmp_path):
    """UCM's variables set in os.environ after the library is loaded are read at open:
    UCM_CONFIG_FILE names the file an empty config reads, UCM_STORAGE_PATH moves the store,
    UCM_METRICS_ENABLE and UCM_METRICS_PORT start the endpoint; unset again, UCM_CONFIG_FILE is
    missed. (In a child process: its metrics endpoint and its environment end with it.)"""
    cfg = tmp_path / "ucm.yaml"
    cfg.write_text("ucm_connectors:\n  - ucm_connector_name: UcmGoStore\n    ucm_connector_config:\n"
                   "      storage_backends: %s\n      device_id: 0\n      tensor_size_list: [%d, %d]\n"
                   "      shard_size: %d\n      block_size: %d\n" % (backend, K, K, SHARD, SHARD * LAYERS))
    r = run_child(ENVIRON, backend, str(cfg), str(tmp_path / "elsewhere"), str(free_port()), str(SHARD))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout, r.stderr[-3000:])


def test_non_bmp_storage_path(backend):
    """A storage_backends path with an emoji and other non-ASCII characters works end to end:
    the directory on disk has that name, and blocks dump and load there."""
    path = os.path.join(backend, "kv-\U0001F600-é-漢字")
    with UcmGoStore(layerwise_config(path)) as store:
        ids = random_ids(3)
        slab = Slab(3 * SHARD)
        dump_layerwise(store, ids, slab)
        slab.zero()
        store.wait(store.load_data(ids, [2] * 3, [[slab.base + i * SHARD] for i in range(3)]))
        for i, bid in enumerate(ids):
            assert slab.read(i * SHARD, SHARD) == expected(bid, 2, SHARD)
    assert os.listdir(backend) == ["kv-\U0001F600-é-漢字"]
    assert os.path.isdir(os.path.join(path, "stores"))


def pcstore_config(backend, device_id, io_size, layers):
    """The config UCM's pcstore_embed_v1 builds (setup_store)."""
    return {"storage_backends": [backend], "block_size": io_size * layers, "device_id": device_id,
            "tensor_size": io_size, "unique_id": secrets.token_hex(8)}


def test_pcstore_whole_block_form(backend):
    """UCM's PcStoreV1 form, as pcstore_embed_v1 drives it: tensor_size = io_size, block_size =
    io_size × layers, dump(hashes, [], tensors) and load(hashes, [], tensors) with one tensor per
    layer; the task ids are > 0, the blocks are found and the bytes come back. The
    same rows as addresses (dump_data / load_data with no shard list), a layer of a block
    dumped whole loads alone, and a tensor of the wrong size is refused saying what was
    expected."""
    dim, length, layers, batch = 64, 32, 5, 6
    io = dim * length * 2
    worker = UcmGoStore(pcstore_config(backend, 0, io, layers))
    try:
        hashes = [secrets.token_bytes(16) for _ in range(batch)]
        tensors = [[torch.rand([dim, length], dtype=torch.bfloat16) for _ in range(layers)] for _ in range(batch)]
        task = worker.dump(hashes, [], tensors)
        assert task.task_id > 0
        worker.wait(task)
        assert all(worker.lookup(hashes))
        back = [[torch.empty_like(t) for t in row] for row in tensors]
        task = worker.load(hashes, [], back)
        assert task.task_id > 0
        worker.wait(task)
        for r in range(batch):
            for c in range(layers):
                assert torch.equal(tensors[r][c], back[r][c]), (r, c)
        # Layer 3 of each block alone.
        one = [[torch.empty_like(tensors[0][0])] for _ in range(batch)]
        worker.wait(worker.load(hashes, [3] * batch, one))
        assert all(torch.equal(one[r][0], tensors[r][3]) for r in range(batch))
        # As addresses: the whole block at one address, and one per layer.
        ids = random_ids(2)
        slab = Slab(2 * io * layers)
        for i, bid in enumerate(ids):
            slab.write(i * io * layers, expected(bid, 0, io * layers))
        worker.wait(worker.dump_data(ids, [], [[slab.base + i * io * layers] for i in range(2)]))
        slab.zero()
        rows = np.array([[slab.base + (i * layers + j) * io for j in range(layers)] for i in range(2)], dtype=np.uint64)
        worker.wait(worker.load_data(ids, [], rows))
        for i, bid in enumerate(ids):
            assert slab.read(i * io * layers, io * layers) == expected(bid, 0, io * layers)
        # A real size mismatch says what was expected, never "want -1".
        wrong = [[torch.empty(dim, length + 1, dtype=torch.bfloat16) for _ in range(layers)]]
        with pytest.raises(UcmGoError) as err:
            worker.load(hashes[:1], [], wrong)
        msg = str(err.value)
        assert err.value.status == ucmgo.EPARAM and "want %d" % io in msg and "want -1" not in msg, msg
        with pytest.raises(UcmGoError) as err:
            worker.load(hashes[:1], [], [tensors[0][:2]])
        msg = str(err.value)
        assert "2 tensors for the whole block" in msg and "%d (one per shard" % layers in msg and "want -1" not in msg, msg
    finally:
        worker.close()
