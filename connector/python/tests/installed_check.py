"""The installed package at work, run by pip_install.sh with a venv's python (`python -I`),
from a directory outside the repository, with no PYTHONPATH and no UCMGO_LIB.

    installed_check.py PACKAGE_DIR LIBRARY [--dist-info]

PACKAGE_DIR is where `import ucmgo` must come from and LIBRARY the libucmgo.so it must load
(inside the venv for `pip install`; the checkout's for `pip install -e`). With --dist-info,
what pip installed from the wheel is checked too: its tag, every RECORD line against the
bytes, the library inside the package directory. UCM's factory creates the store by module path ("ucmgo") through
a stand-in of UCM's package layout (the one test_store.py uses), as a UCM config with
ucm_connector_module_path: ucmgo does; a block is dumped, looked up and loaded back.
"""

import base64
import ctypes
import hashlib
import mmap
import os
import runpy
import sys
import sysconfig
import tempfile
from pathlib import Path

# UCM's package as the repository's tests stand it in (ucm_standin.py beside this file).
STANDIN = runpy.run_path(str(Path(__file__).with_name("ucm_standin.py")))["UCM_STANDIN"]

TENSOR = 16 << 10  # one tensor of a block; a block is two


def check_dist_info(pkg_dir):
    """The installed distribution as pip wrote it from the wheel: the wheel's tag is this
    platform's, and every file its RECORD lists with a hash (the wheel's RECORD lines, which pip
    carries over, the library among them) has exactly those bytes."""
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    infos = list(pkg_dir.parent.glob("ucmgo-*.dist-info"))
    assert len(infos) == 1, infos
    wheel_meta = (infos[0] / "WHEEL").read_text()
    assert "Root-Is-Purelib: false" in wheel_meta and ("Tag: py3-none-%s" % plat) in wheel_meta, wheel_meta
    hashed = set()
    for line in (infos[0] / "RECORD").read_text().splitlines():
        path, digest, size = line.rsplit(",", 2)
        if not digest:
            continue
        data = (pkg_dir.parent / path).read_bytes()
        want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == want and int(size) == len(data), line
        hashed.add(path)
    assert {"ucmgo/libucmgo.so", "ucmgo/__init__.py", "ucmgo/_lib.py", "ucmgo/store.py",
            "ucmgo/sparse/__init__.py", "ucmgo/sparse/esa/retrieval_backend.py",
            "ucmgo/sparse/kvstar/kvstar_retrieve.py", "ucmgo/sparse/gsa/gsa_offload_ops.py"} <= hashed, hashed


def address(m):
    """The address of an mmap's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def main():
    pkg_dir, library = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    for var in ("PYTHONPATH", "UCMGO_LIB"):
        assert var not in os.environ, var
    repo = Path(__file__).resolve().parents[3]
    assert not Path.cwd().resolve().is_relative_to(repo), Path.cwd()
    if len(sys.argv) > 3 and sys.argv[3] == "--dist-info":
        check_dist_info(pkg_dir)

    with tempfile.TemporaryDirectory() as tmp:
        standin = Path(tmp) / "standin"
        for rel, text in STANDIN.items():
            (standin / rel).parent.mkdir(parents=True, exist_ok=True)
            (standin / rel).write_text(text)
        sys.path.insert(0, str(standin))
        from ucm.store.factory_v1 import UcmConnectorFactoryV1
        from ucm.store.ucmstore_v1 import UcmKVStoreBaseV1

        cfg = {"storage_backends": str(Path(tmp) / "kv"), "device_id": 0,
               "tensor_size_list": [TENSOR, TENSOR], "shard_size": 2 * TENSOR, "block_size": 2 * TENSOR}
        store = UcmConnectorFactoryV1.create_connector("UcmGoStore", cfg, "ucmgo")
        import ucmgo
        import ucmgo._lib

        assert isinstance(store, UcmKVStoreBaseV1) and ucmgo.HAVE_UCM
        assert Path(ucmgo.__file__).resolve().parent == pkg_dir, ucmgo.__file__
        loaded = Path(ucmgo._lib.get()._name).resolve()
        assert loaded == library, loaded

        src, dst = mmap.mmap(-1, 2 * TENSOR), mmap.mmap(-1, 2 * TENSOR)
        payload = hashlib.sha256(b"installed").digest() * (2 * TENSOR // 32)
        src[:] = payload
        bid = hashlib.md5(b"installed block").digest()
        assert store.lookup([bid]) == [False]
        task = store.dump_data([bid], [0], [[address(src), address(src) + TENSOR]])
        store.wait(task)
        assert task.failed == [False], task.failed
        assert store.lookup([bid]) == [True]
        task = store.load_data([bid], [0], [[address(dst), address(dst) + TENSOR]])
        store.wait(task)
        assert dst[:] == payload
        store.close()
    print("installed ucmgo ok: %s, %s" % (pkg_dir, library))


if __name__ == "__main__":
    main()
