#!/usr/bin/env bash
# Reproducible build of Mooncake Store (master, client libraries, Go binding) for the `mooncake`
# tier (docs/mooncake.md), from the unmodified upstream tarballs in ../shared/vendor.
#
# Outputs go to a prefix outside the clone, keyed by the tarballs' SHA-256 and this recipe's
# version, so only the first run on a machine pays the build (~15 minutes on 2 cores):
#
#   $UCM_MOONCAKE_CACHE/<key>/           default UCM_MOONCAKE_CACHE=/var/cache/ucm-mooncake
#     bin/mooncake_master                the master (metadata HTTP server built in; a wrapper
#                                        around libexec/mooncake_master that finds lib/)
#     lib/                               libmooncake_store.a and friends, libasio.so
#     include/                           store_c.h and the headers it needs
#     go/                                Mooncake's Go binding (module github.com/kvcache-ai/Mooncake/mooncake-store/go)
#     env.sh                             CGO_CFLAGS, CGO_LDFLAGS, MOONCAKE_MASTER for `go build -tags mooncake`
#
# Usage:
#   tools/mooncake/build.sh                 build unless cached; prints the prefix on the last line
#   tools/mooncake/build.sh --prefix        print the prefix the current inputs map to (no build)
#   tools/mooncake/build.sh --install-deps  apt-get install the Debian build packages first
#
# Environment: UCM_MOONCAKE_VENDOR (default: ../shared/vendor next to the clone, else
# /work/shared/vendor), UCM_MOONCAKE_CACHE, UCM_MOONCAKE_JOBS (default: nproc).
# The tarballs are never modified: the one patch the build needs (Mooncake's top-level
# CMakeLists.txt adds extern/pybind11 unconditionally, the tarball leaves that submodule empty;
# we fall back to Debian's pybind11) is applied to the extracted build tree.
set -euo pipefail

# Bump when the recipe below changes in a way that changes the outputs.
RECIPE=2

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
vendor=${UCM_MOONCAKE_VENDOR:-}
if [ -z "$vendor" ]; then
  for d in "$repo/../shared/vendor" /work/shared/vendor; do
    if [ -f "$d/mooncake-src.tar.xz" ]; then vendor=$(cd "$d" && pwd); break; fi
  done
fi
mc_tar="$vendor/mooncake-src.tar.xz"
ylt_tar="$vendor/yalantinglibs-src.tar.xz"
cache=${UCM_MOONCAKE_CACHE:-/var/cache/ucm-mooncake}
jobs=${UCM_MOONCAKE_JOBS:-$(nproc)}

log() { echo "mooncake build: $*" >&2; }
die() { log "$*"; exit 1; }

[ -f "$mc_tar" ] && [ -f "$ylt_tar" ] ||
  die "tarballs not found (looked in '${vendor:-../shared/vendor}'; set UCM_MOONCAKE_VENDOR)"

key=$( { echo "recipe $RECIPE"; sha256sum <"$mc_tar"; sha256sum <"$ylt_tar"; } | sha256sum | cut -c1-16)
prefix="$cache/$key"

case "${1:-}" in
  --prefix) echo "$prefix"; exit 0 ;;
  --install-deps) install_deps=1 ;;
  "") install_deps=0 ;;
  *) die "unknown argument $1 (use --prefix or --install-deps)" ;;
esac

# The Debian packages of the build; the -dev ones are also what `go build -tags mooncake` links
# against (env.sh's CGO_LDFLAGS), and procps is harness.sh's pgrep.
DEBS=(build-essential cmake ninja-build pkg-config libibverbs-dev libgoogle-glog-dev libgflags-dev
  libjsoncpp-dev libunwind-dev libnuma-dev python3-dev libboost-all-dev libssl-dev libyaml-cpp-dev
  libcurl4-openssl-dev liburing-dev libmsgpack-dev libzstd-dev libasio-dev libxxhash-dev pybind11-dev
  procps)

# missing_debs sets missing to the packages of DEBS dpkg does not know installed.
missing_debs() {
  missing=()
  local p
  for p in "${DEBS[@]}"; do
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || missing+=("$p")
  done
}

# With --install-deps the packages are installed first, also when the build is cached: the
# mooncake build of UCM-Go links against them.
if [ "$install_deps" = 1 ]; then
  missing_debs
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing Debian packages: ${missing[*]}; installing them needs root (run as root)"
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

# finish_prefix makes bin/mooncake_master a wrapper that finds the prefix's libasio.so (the
# binary's own run path names the build tree, which is gone) and keeps its process id (exec).
# It is cheap and idempotent, and runs on cached prefixes too.
finish_prefix() {
  local p=$1
  if [ ! -x "$p/libexec/mooncake_master" ]; then
    mkdir -p "$p/libexec"
    mv "$p/bin/mooncake_master" "$p/libexec/mooncake_master"
  fi
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s/libexec/mooncake_master" "$@"\n' "$prefix" "$prefix" >"$p/bin/mooncake_master.tmp"
  chmod +x "$p/bin/mooncake_master.tmp"
  mv "$p/bin/mooncake_master.tmp" "$p/bin/mooncake_master"
  # The cgo flags: the prefix's archives as one group, rpath to its lib/ (libasio.so), and Go's
  # default -O2 -g kept (CGO_CFLAGS replaces them for every cgo package of the build).
  local ldflags="-L$prefix/lib -Wl,-rpath,$prefix/lib -Wl,--start-group" a n
  for a in "$p"/lib/*.a; do n=$(basename "$a" .a); ldflags+=" -l${n#lib}"; done
  ldflags+=" -Wl,--end-group -lasio -lxxhash -lyaml-cpp -lstdc++ -lnuma -lglog -lgflags"
  ldflags+=" -libverbs -lmlx5 -ljsoncpp -lzstd -lcurl -luring -lm -lpthread"
  cat >"$p/env.sh" <<EOF
# Generated by tools/mooncake/build.sh (recipe $RECIPE). Source it before go build -tags mooncake.
export UCM_MOONCAKE_PREFIX='$prefix'
export MOONCAKE_MASTER='$prefix/bin/mooncake_master'
export CGO_ENABLED=1
export CGO_CFLAGS='-O2 -g -I$prefix/include'
export CGO_LDFLAGS='$ldflags'
EOF
}

if [ -f "$prefix/.complete" ]; then
  finish_prefix "$prefix"
  log "cached at $prefix"
  echo "$prefix"
  exit 0
fi

missing_debs
if [ ${#missing[@]} -gt 0 ]; then
  die "missing Debian packages: ${missing[*]} (run with --install-deps, or apt-get install them)"
fi

mkdir -p "$cache"
# One build per key at a time; a second caller waits and then finds the cache.
exec 9>"$cache/.$key.lock"
flock 9
if [ -f "$prefix/.complete" ]; then echo "$prefix"; exit 0; fi

work="$cache/.$key.build"
rm -rf "$prefix"
started=$(date +%s)
mc="$work/src"
if [ -f "$work/.configured" ]; then
  # An interrupted build of the same inputs resumes where it stopped (ninja is incremental).
  log "resuming the build in $work (log: $work/build.log)"
else
  rm -rf "$work"
  mkdir -p "$work/src" "$work/ylt-prefix" "$work/ylt-src"
  log "building into $prefix (log: $work/build.log)"
  tar -xJf "$mc_tar" -C "$work/src"
  tar -xJf "$ylt_tar" -C "$work/ylt-src"
  ylt_root=$(dirname "$(find "$work/ylt-src" -maxdepth 2 -name CMakeLists.txt | head -1)")

  # The pybind11 fallback, applied to the build tree only.
  python3 - "$mc/CMakeLists.txt" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
old = "else()\n  add_subdirectory(${CMAKE_CURRENT_SOURCE_DIR}/extern/pybind11)\nendif()"
new = ("elseif(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/extern/pybind11/CMakeLists.txt)\n"
       "  add_subdirectory(${CMAKE_CURRENT_SOURCE_DIR}/extern/pybind11)\n"
       "else()\n  find_package(pybind11 CONFIG REQUIRED)\nendif()")
if old not in s:
    sys.exit("mooncake build: the pybind11 block of CMakeLists.txt is not where the recipe expects it")
open(p, "w").write(s.replace(old, new, 1))
EOF

  {
    cmake -S "$ylt_root" -B "$work/ylt-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$work/ylt-prefix" \
      -DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF -DBUILD_UNIT_TESTS=OFF
    cmake --build "$work/ylt-build" -j "$jobs"
    cmake --install "$work/ylt-build"

    # USE_EVENT_DRIVEN_COMPLETION: a client call waiting for its transfers sleeps on a condition
    # variable the transport signals, instead of Mooncake's default, which polls the transfer
    # status in a loop without pausing: every waiting put or get then holds a core, which on a
    # small machine starves the transport threads that move the bytes (docs/mooncake.md).
    cmake -S "$mc" -B "$work/mc-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/ylt-prefix" \
      -DUSE_CUDA=OFF -DUSE_ETCD=OFF -DUSE_HTTP=ON -DWITH_STORE=ON -DWITH_TE=ON \
      -DWITH_STORE_RUST=OFF -DBUILD_UNIT_TESTS=OFF -DBUILD_EXAMPLES=OFF \
      -DUSE_EVENT_DRIVEN_COMPLETION=ON
  } >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; die "configure failed (full log: $work/build.log)"; }
  touch "$work/.configured"
fi
cmake --build "$work/mc-build" -j "$jobs" --target \
  mooncake_master mooncake_store transfer_engine cachelib_memory_allocator base mooncake_common asio_shared \
  >>"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; die "build failed (full log: $work/build.log)"; }

# Assemble the prefix in a temporary directory, then rename it into place.
out="$cache/.$key.out"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/include" "$out/go"
cp "$(find "$work/mc-build" -type f -name mooncake_master -perm -u+x | head -1)" "$out/bin/"
for l in libmooncake_store.a libcachelib_memory_allocator.a libtransfer_engine.a libbase.a \
  libmooncake_common.a libasio.so; do
  f=$(find "$work/mc-build" -name "$l" -not -path '*/shared/*' | head -1)
  [ -n "$f" ] || die "build output $l not found"
  cp "$f" "$out/lib/"
done
# Other static archives the store library's objects reference (local SSD, metadata plugin).
find "$work/mc-build" -name '*.a' -not -path '*/shared/*' -not -name 'libmooncake_store_master.a' -exec cp -n {} "$out/lib/" \;
cp -r "$mc/mooncake-store/include/." "$out/include/"
cp -r "$mc/mooncake-transfer-engine/include/." "$out/include/"
cp -r "$mc/mooncake-store/go/." "$out/go/"
cp "$mc/LICENSE-APACHE" "$out/"

echo "mooncake $(basename "$mc_tar") yalantinglibs $(basename "$ylt_tar") recipe $RECIPE key $key built $(date -u +%FT%TZ) in $(( $(date +%s) - started ))s" >"$out/BUILDINFO"
finish_prefix "$out"
touch "$out/.complete"
mv "$out" "$prefix"
rm -rf "$work"
log "done in $(( $(date +%s) - started ))s"
echo "$prefix"
