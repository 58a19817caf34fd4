"""Test set-up: the library (built by `make lib` when missing) and the package on sys.path."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

PYDIR = Path(__file__).resolve().parents[1]
REPO = PYDIR.parents[1]
sys.path.insert(0, str(PYDIR))


def pytest_configure(config):
    lib = Path(os.environ.get("UCMGO_LIB", REPO / "lib" / "libucmgo.so"))
    if not lib.is_file():
        subprocess.run(["make", "-C", str(REPO), "lib"], check=True)
    os.environ["UCMGO_LIB"] = str(lib)


@pytest.fixture
def backend(tmp_path):
    """A storage_backends directory for one test."""
    d = tmp_path / "ucm"
    d.mkdir()
    return str(d)
