#!/usr/bin/env bash
# The Debian packages `make test` needs beyond Go, gcc, make and git, and fio for the benchmarks
# (`make deps`, which `make test`, `make bench` and `make bench-check` run first). Each is checked (dpkg's status, or the command or Python module it provides)
# and apt-get installs only what is missing: on a machine that has everything it installs
# nothing and only reports. Installing needs root; without root it names what is missing and
# fails. `make test` itself needs root too (test-gluster starts glusterd and mounts FUSE
# volumes), which this says when it is not run as root.
#
#   PYTHON=/usr/bin/python3 bash tools/deps.sh     # the interpreter make test-python uses
#
# The Mooncake build packages are not here: `make test-mooncake` installs them itself
# (tools/mooncake/build.sh --install-deps).
set -euo pipefail
PYTHON=${PYTHON:-/usr/bin/python3}

log() { echo "make deps: $*" >&2; }

need=() have=()

# installed PKG: dpkg knows PKG installed (not merely its configuration files left).
installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; }
# has CMD: CMD is on PATH or in an sbin directory (not on a non-root user's PATH).
has() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
# imports MOD: $PYTHON imports MOD.
imports() { "$PYTHON" -c "import $1" >/dev/null 2>&1; }

# want PKG [CHECK...]: PKG is needed unless it is installed or CHECK succeeds (what it provides
# is there another way).
want() {
  local pkg=$1
  shift
  if installed "$pkg" || { [ $# -gt 0 ] && "$@"; }; then have+=("$pkg"); else need+=("$pkg"); fi
}

# check sets need and have: what make test needs, missing and present.
check() {
  need=() have=()
  # Debian's python3 with numpy, pytest and torch (make test-python: connector/python/tests and
  # tools/ucm-e2e's own tests).
  want python3 test -x "$PYTHON"
  want python3-numpy imports numpy
  want python3-pytest imports pytest
  want python3-torch imports torch
  # pip and venv: make test-pip installs the package into fresh venvs of that python3.
  want python3-pip
  want python3-venv
  # GlusterFS server and client for the sharing tests on a real volume (make test-gluster).
  want glusterfs-server has glusterd
  want glusterfs-client has mount.glusterfs
  # Prometheus, which scrapes a store and evaluates the dashboards' queries (make test-prometheus).
  want prometheus has prometheus
  # pgrep, with which the GlusterFS harness finds its own processes.
  want procps has pgrep
  # ISA-L, whose CRC32C the build links when its header is there (the Makefile's TAGS; without
  # it the checksums come from Go's slower hash/crc32).
  want libisal-dev test -f /usr/include/isa-l/crc.h
  # fio, the physical limit the benchmarks measure against (make bench, make bench-check; the
  # tests give the bench a stand-in).
  want fio has fio
}

check
root=0
[ "$(id -u)" = 0 ] && root=1

if [ ${#need[@]} -gt 0 ]; then
  if [ $root = 0 ]; then
    log "missing Debian packages: ${need[*]}"
    log "installing them needs root: run 'make deps' as root (or: sudo apt-get install ${need[*]})"
    exit 1
  fi
  command -v apt-get >/dev/null 2>&1 || { log "no apt-get (not Debian?): install the equivalents of ${need[*]}"; exit 1; }
  log "installing ${need[*]} (on a bare machine about 400 MB to download, mostly torch's; a few minutes)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  # Everything must now be there, as the checks see it (an import that still fails is an error).
  installed_now=("${need[@]}")
  check
  [ ${#need[@]} -eq 0 ] || { log "still missing after apt-get install: ${need[*]}"; exit 1; }
  log "installed ${installed_now[*]}"
else
  log "all present (${have[*]}): nothing to install"
fi

# FUSE, which the GlusterFS mounts need: a kernel module, not a package.
if [ ! -c /dev/fuse ]; then
  if [ $root = 1 ] && command -v modprobe >/dev/null 2>&1; then modprobe fuse 2>/dev/null || true; fi
  if [ ! -c /dev/fuse ]; then
    log "no /dev/fuse: make test-gluster needs FUSE (modprobe fuse; in a container, give it /dev/fuse and CAP_SYS_ADMIN)"
    exit 1
  fi
fi

if [ $root = 0 ]; then
  log "NOTE: not root: make test-gluster (part of make test) starts glusterd and mounts volumes, and will fail; run make test as root"
fi
