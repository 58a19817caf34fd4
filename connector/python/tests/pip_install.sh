#!/usr/bin/env bash
# The Python package as a user installs it (make test-pip): a fresh venv of Debian's python3,
# `pip install ./connector/python` with pip's default flags and no package index (any download
# would fail at once: PyPI is not reachable here or in CI), then `import ucmgo`, UCM's factory,
# a store, a dump and a load from a directory outside the repository with a clean environment
# (no PYTHONPATH, no UCMGO_LIB): the library must be the one inside the venv, the wheel's tag
# this platform's and its RECORD right. An editable install (`pip install -e`) is checked the
# same way, loading the checkout's lib/libucmgo.so.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check=$repo/connector/python/tests/installed_check.py
# Nothing may come from an index: an unreachable one (connection refused) and no local wheels.
pip_env=(env PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_FIND_LINKS= PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1)
clean_env=(env -i PATH=/usr/bin:/bin HOME="$tmp" TMPDIR="$tmp")
mkdir "$tmp/elsewhere"

echo "== pip install ./connector/python"
"$PYTHON" -m venv "$tmp/venv"
(cd "$repo" && "${pip_env[@]}" "$tmp/venv/bin/python" -m pip install -q ./connector/python)
site=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
(cd "$tmp/elsewhere" && "${clean_env[@]}" "$tmp/venv/bin/python" -I "$check" \
  "$site/ucmgo" "$site/ucmgo/libucmgo.so" --dist-info)

echo "== pip install -e ./connector/python"
"$PYTHON" -m venv "$tmp/venv-e"
(cd "$repo" && "${pip_env[@]}" "$tmp/venv-e/bin/python" -m pip install -q -e ./connector/python)
(cd "$tmp/elsewhere" && "${clean_env[@]}" "$tmp/venv-e/bin/python" -I "$check" \
  "$repo/connector/python/ucmgo" "$repo/lib/libucmgo.so")
