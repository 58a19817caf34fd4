"""The PEP 517 build backend of the ucmgo package, with nothing but the standard library.

pip builds a package in an isolated environment into which it installs the backend's
requirements from an index. This backend has none (pyproject.toml: ``requires = []``), so
``pip install ./connector/python`` works with pip's default flags on a machine without PyPI
access. What it does:

* ``build_wheel``: ``go build -buildmode=c-shared`` of the C ABI (connector/capi) with the
  repository's build flags (the ``uring`` tag, ``-ldflags=-checklinkname=0``; the Makefile's
  BUILDFLAGS), then a wheel holding the ``ucmgo`` package (its subpackages too) with ``libucmgo.so`` inside its
  directory, where ``ucmgo/_lib.py`` looks for it after UCMGO_LIB. The wheel is tagged
  ``py3-none-<platform>``: pure Python over a native library loaded with ctypes, so any
  Python 3 on this platform, but only this platform.
* ``build_editable`` (PEP 660, ``pip install -e``): builds the library where ``make lib``
  puts it (``<repo>/lib/libucmgo.so``, which ``_lib.py`` finds from a checkout) and installs a
  ``.pth`` file that puts ``connector/python`` on ``sys.path``.
* ``prepare_metadata_for_build_wheel`` / ``_editable``: the metadata alone, no Go build.

There is no ``build_sdist``: the package is built from the repository (its Go module), not
from a source archive of this directory alone.

Go and a C compiler (cgo) must be on PATH; ``GO`` names another go binary.
"""

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

try:
    import tomllib as _toml
except ImportError:  # Python < 3.11
    try:
        import tomli as _toml  # type: ignore[no-redef]
    except ImportError:
        _toml = None

# The package directory (connector/python) and the Go module root above it.
PKG_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "ucmgo"
LIB_NAME = "libucmgo.so"

# The Makefile's BUILDFLAGS: the io_uring backend is behind the `uring` tag and links into
# syscall internals, which Go >= 1.23 allows only with -checklinkname=0; `nonvml` leaves NVML
# discovery (whose symbols go-nvml leaves unresolved) out of the shared library, as `make lib` does.
# Like the Makefile, the `isal` tag (CRC32C by ISA-L) is added when libisal-dev's header is
# installed; without it the library checksums with Go's hash/crc32, the same function.
_ISAL_HEADER = Path("/usr/include/isa-l/crc.h")
GO_BUILD_FLAGS = ["-tags", "uring nonvml" + (" isal" if _ISAL_HEADER.exists() else ""), "-ldflags=-checklinkname=0"]

# Python's machine names for Go's GOARCH values on the platforms the engine supports.
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}

# Zip entries get a fixed time so that two builds of one tree give the same files.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


class BuildError(RuntimeError):
    """The package could not be built; the message says what was missing or failed."""


def _project():
    """The [project] table of pyproject.toml: name, version, description, requires-python."""
    path = PKG_ROOT / "pyproject.toml"
    if _toml is None:
        raise BuildError("%s: reading it needs Python >= 3.11 (tomllib) or tomli" % path)
    with open(path, "rb") as f:
        project = _toml.load(f).get("project", {})
    for key in ("name", "version"):
        if not isinstance(project.get(key), str) or not project[key]:
            raise BuildError("%s: [project] %s missing or not a string" % (path, key))
    if project["name"] != PACKAGE:
        raise BuildError("%s: [project] name %r, want %r" % (path, project["name"], PACKAGE))
    return project


def _repo_root():
    """The Go module root: the nearest directory above the package holding go.mod and the C
    ABI's package (connector/capi)."""
    for d in PKG_ROOT.parents:
        if (d / "go.mod").is_file() and (d / "connector" / "capi").is_dir():
            return d
    raise BuildError("no Go module with connector/capi above %s: the package builds from a UCM-Go checkout" % PKG_ROOT)


def _platform():
    """The wheel's platform tag (linux_x86_64, ...) and Go's GOOS and GOARCH for it."""
    plat = sysconfig.get_platform()  # linux-x86_64
    osname, _, machine = plat.partition("-")
    if osname != "linux" or machine not in _GOARCH:
        raise BuildError("platform %s: libucmgo.so builds for linux-x86_64 and linux-aarch64 only" % plat)
    return "linux_" + machine, "linux", _GOARCH[machine]


def _wheel_tag():
    return "py3-none-" + _platform()[0]


def _dist_info_name(project):
    return "%s-%s.dist-info" % (project["name"], project["version"])


def _metadata(project):
    lines = [
        "Metadata-Version: 2.1",
        "Name: " + project["name"],
        "Version: " + project["version"],
    ]
    if project.get("description"):
        lines.append("Summary: " + project["description"])
    if project.get("requires-python"):
        lines.append("Requires-Python: " + project["requires-python"])
    return "\n".join(lines) + "\n"


def _wheel_file():
    return "Wheel-Version: 1.0\nGenerator: ucmgo_build\nRoot-Is-Purelib: false\nTag: %s\n" % _wheel_tag()


def _go_build(out):
    """Builds the C ABI as a shared library at out (a Path); the Go build cache makes a rebuild
    of an unchanged tree quick."""
    repo = _repo_root()
    go = os.environ.get("GO") or shutil.which("go")
    if not go:
        raise BuildError("go not found on PATH (set GO to the go binary): building libucmgo.so needs Go and a C compiler")
    _, goos, goarch = _platform()
    env = dict(os.environ, CGO_ENABLED="1", GOOS=goos, GOARCH=goarch)
    cmd = [go, "build"] + GO_BUILD_FLAGS + ["-buildmode=c-shared", "-o", str(out), "./connector/capi"]
    print("ucmgo_build: %s (in %s)" % (" ".join(cmd), repo), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=str(repo), env=env)
    if proc.returncode != 0:
        raise BuildError("%s failed with exit status %d" % (" ".join(cmd), proc.returncode))
    header = out.with_suffix(".h")  # go build writes the cgo header beside the library
    if header.exists():
        header.unlink()


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return "sha256=" + digest


def _write_wheel(wheel_directory, project, files):
    """Writes the wheel: files is a list of (archive name, bytes, executable); the dist-info
    files (METADATA, WHEEL, RECORD) are added. Returns the wheel's file name."""
    dist_info = _dist_info_name(project)
    entries = list(files) + [
        (dist_info + "/METADATA", _metadata(project).encode("utf-8"), False),
        (dist_info + "/WHEEL", _wheel_file().encode("utf-8"), False),
    ]
    record = "".join("%s,%s,%d\n" % (name, _record_hash(data), len(data)) for name, data, _ in entries)
    record += dist_info + "/RECORD,,\n"
    entries.append((dist_info + "/RECORD", record.encode("utf-8"), False))
    name = "%s-%s-%s.whl" % (project["name"], project["version"], _wheel_tag())
    path = Path(wheel_directory) / name
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arcname, data, executable in entries:
            info = zipfile.ZipInfo(arcname, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = ((0o755 if executable else 0o644) | 0o100000) << 16
            zf.writestr(info, data)
    os.replace(tmp, path)
    return name


def _package_files():
    """The package's Python modules, its subpackages' included (ucmgo/sparse/...), as wheel
    entries."""
    src = PKG_ROOT / PACKAGE
    files = sorted(p for p in src.rglob("*.py") if p.is_file() and "__pycache__" not in p.parts)
    if not files:
        raise BuildError("no Python modules in %s" % src)
    return [("%s/%s" % (PACKAGE, p.relative_to(src).as_posix()), p.read_bytes(), False) for p in files]


def _prepare_metadata(metadata_directory):
    project = _project()
    d = Path(metadata_directory) / _dist_info_name(project)
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(_metadata(project), encoding="utf-8")
    (d / "WHEEL").write_text(_wheel_file(), encoding="utf-8")
    return d.name


# PEP 517 hooks.


def get_requires_for_build_wheel(config_settings=None):
    """Nothing to install: the backend needs only the standard library (and Go on PATH)."""
    return []


def get_requires_for_build_editable(config_settings=None):
    """Nothing to install, as for a wheel."""
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    """Writes the wheel's .dist-info (METADATA, WHEEL) without building anything."""
    return _prepare_metadata(metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    """Writes the editable wheel's .dist-info, as for a wheel."""
    return _prepare_metadata(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """Builds libucmgo.so and writes the platform wheel with it inside the ucmgo package;
    returns the wheel's file name."""
    project = _project()
    with tempfile.TemporaryDirectory(prefix="ucmgo-build-") as tmp:
        lib = Path(tmp) / LIB_NAME
        _go_build(lib)
        files = _package_files() + [("%s/%s" % (PACKAGE, LIB_NAME), lib.read_bytes(), True)]
        return _write_wheel(wheel_directory, project, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """Builds libucmgo.so into <repo>/lib (as `make lib` does) and writes a wheel whose .pth
    file puts the package's source directory on sys.path; returns the wheel's file name."""
    project = _project()
    lib_dir = _repo_root() / "lib"
    lib_dir.mkdir(exist_ok=True)
    tmp = lib_dir / (LIB_NAME + ".tmp")
    _go_build(tmp)
    os.replace(tmp, lib_dir / LIB_NAME)
    pth = ("__editable__.%s.pth" % project["name"], (str(PKG_ROOT) + "\n").encode("utf-8"), False)
    return _write_wheel(wheel_directory, project, [pth])
