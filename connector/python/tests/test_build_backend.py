"""The wheel build backend (build_backend/ucmgo_build.py) packs every module of the package,
subpackages included, at its path under ucmgo/."""

import sys
import zipfile
from pathlib import Path

PYDIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PYDIR / "build_backend"))

import ucmgo_build  # noqa: E402


def test_package_files_include_subpackages():
    names = [name for name, _, _ in ucmgo_build._package_files()]
    src = PYDIR / "ucmgo"
    want = sorted("ucmgo/" + p.relative_to(src).as_posix() for p in src.rglob("*.py") if "__pycache__" not in p.parts)
    assert sorted(names) == want
    for name in ("ucmgo/__init__.py", "ucmgo/sparse/__init__.py", "ucmgo/sparse/esa/__init__.py",
                 "ucmgo/sparse/esa/retrieval_backend.py"):
        assert name in names
    assert not any("__pycache__" in n for n in names)


def test_wheel_holds_subpackages(tmp_path):
    """A wheel written from the package files (the library left out: no Go build here) has
    the subpackages' modules with their bytes."""
    files = ucmgo_build._package_files()
    name = ucmgo_build._write_wheel(tmp_path, ucmgo_build._project(), files)
    with zipfile.ZipFile(tmp_path / name) as zf:
        got = zf.read("ucmgo/sparse/esa/retrieval_backend.py")
    assert got == (PYDIR / "ucmgo" / "sparse" / "esa" / "retrieval_backend.py").read_bytes()
