#!/usr/bin/env bash
# Runs UCM's own V1 store e2e scripts (ucm/store/test/e2e in UCM's repository) against UCM-Go,
# changed only by tools/ucm-e2e/subs.py's table (store class, cuda -> cpu, sizes), with UCM's
# compiled logger stubbed; prints PASS/FAIL per script and "N of M passed"; exits non-zero
# unless all passed. docs/connector.md, "UCM's own e2e suite", says more.
#
#   tools/ucm-e2e/run.sh MIRROR [SCRIPT...] [--timeout S] [--keep] [-v] [--show] [--installed]
#   tools/ucm-e2e/run.sh --install-deps      # Debian packages the extracted UCM package imports
#
# MIRROR is UCM's git dir (a bare repo, e.g. a `fetch` of ModelEngine-Group/unified-cache-management);
# nothing is extracted into it or into this repository. Without --installed, libucmgo.so is
# built with `make lib` when it is missing (UCMGO_LIB names another).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
PYTHON="${PYTHON:-/usr/bin/python3}"

# UCM's package imports wrapt (ucm/__init__.py's logger patch), numpy and torch.
deps=(python3-wrapt python3-numpy python3-torch)
if [[ "${1:-}" == "--install-deps" ]]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${deps[@]}"
  exit 0
fi
if ! "$PYTHON" -c 'import wrapt, numpy, torch' 2>/dev/null; then
  echo "ucm-e2e: $PYTHON lacks wrapt, numpy or torch: run $0 --install-deps (apt: ${deps[*]})" >&2
  exit 2
fi

installed=0
for a in "$@"; do [[ "$a" == "--installed" ]] && installed=1; done
if [[ $installed == 0 && -z "${UCMGO_LIB:-}" && ! -f "$repo/lib/libucmgo.so" ]]; then
  make -C "$repo" lib
fi
exec "$PYTHON" "$here/ucm_e2e.py" "$@"
