#!/usr/bin/env bash
# Runs a go command against the Mooncake build tools/mooncake/build.sh made (building it first
# if this machine has none): with Mooncake's cgo flags, the build tags `mooncake uring` (and
# `isal` where the Makefile adds it), and a generated Go workspace (bin/mooncake.work) that
# adds Mooncake's Go binding (github.com/kvcache-ai/Mooncake/mooncake-store/go, from the build
# prefix) to this module.
# Nothing of Mooncake is in the repository or in go.mod.
#
#   tools/mooncake/go.sh test -count=1 ./fuzz/mooncake/
#   tools/mooncake/go.sh build -o bin/ucm-lab-mooncake ./lab/cmd/ucm-lab
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
[ "$#" -gt 0 ] || { echo "usage: $0 GO-SUBCOMMAND [ARGS...]" >&2; exit 2; }
prefix=$(bash "$here/build.sh" | tail -1)
# shellcheck source=/dev/null
. "$prefix/env.sh"
mkdir -p "$repo/bin"
work="$repo/bin/mooncake.work"
gover=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$repo/go.mod")
printf 'go %s\n\nuse (\n\t%s\n\t%s\n)\n' "$gover" "$repo" "$prefix/go" >"$work"
export GOWORK="$work"
sub=$1; shift
# As the Makefile: CRC32C by ISA-L when libisal-dev's header is installed.
tags="mooncake uring"
[ -f /usr/include/isa-l/crc.h ] && tags="$tags isal"
exec "${GO:-go}" "$sub" -tags "$tags" -ldflags=-checklinkname=0 "$@"
