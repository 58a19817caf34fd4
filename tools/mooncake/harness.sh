#!/usr/bin/env bash
# Runs a command against Mooncake on loopback and leaves nothing running afterwards.
#
#   tools/mooncake/harness.sh [--master] COMMAND...
#
# The command runs in a process group of its own (setsid); when it ends, whatever it left in the
# group (a mooncake_master, client processes) is killed, on success and on failure (and on
# SIGINT/SIGTERM of the harness), and the script checks that nothing is left. With --master,
# a mooncake_master is started first on free 127.0.0.1 ports (RPC, HTTP metadata, metrics) and
# the command gets UCM_MOONCAKE_MASTER (host:port) and UCM_MOONCAKE_METADATA (URL). The command
# also gets MC_TCP_BIND_ADDRESS=127.0.0.1 (Mooncake's TCP transport binds loopback) and
# MOONCAKE_MASTER (the binary). The master logs into a fresh directory under $TMPDIR (default
# /tmp), removed when the run succeeds and kept, its path printed, when it fails.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
start_master=0
if [ "${1:-}" = "--master" ]; then start_master=1; shift; fi
[ "$#" -gt 0 ] || { echo "usage: $0 [--master] COMMAND..." >&2; exit 2; }

prefix=$(bash "$here/build.sh" | tail -1)
# shellcheck source=/dev/null
. "$prefix/env.sh"
export MC_TCP_BIND_ADDRESS=127.0.0.1 MOONCAKE_MASTER
log="" # the master's log, with --master
groups=() # process groups started here: the master's, the command's

# shellcheck disable=SC2317 # runs from the EXIT trap
cleanup() {
  local rc=$? g left=""
  set +e
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
  for g in "${groups[@]}"; do
    for _ in $(seq 1 50); do pgrep -g "$g" >/dev/null || break; sleep 0.1; done
    left+=$(pgrep -g "$g" | tr '\n' ' ')
  done
  if [ -n "$left" ]; then echo "mooncake harness: processes left running: $left" >&2; rc=1; fi
  if [ "$rc" -ne 0 ]; then
    echo "mooncake harness: failed (exit $rc)" >&2
    if [ -s "$log" ]; then echo "mooncake harness: the master's log: $log" >&2; fi
  fi
  if [ -n "$log" ] && { [ "$rc" -eq 0 ] || [ ! -s "$log" ]; }; then rm -rf "$(dirname "$log")"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

if [ $start_master = 1 ]; then
  log="$(mktemp -d "${TMPDIR:-/tmp}/ucm-mooncake-master.XXXXXX")/master.log"
  rpc=$(free_port); http=$(free_port); metrics=$(free_port)
  setsid "$MOONCAKE_MASTER" --enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 \
    --http_metadata_server_port="$http" --rpc_address=127.0.0.1 --rpc_port="$rpc" \
    --metrics_host=127.0.0.1 --metrics_port="$metrics" --logtostderr=true >"$log" 2>&1 &
  master=$!
  disown "$master" # no job report when the cleanup kills it
  groups+=("$master")
  for _ in $(seq 1 600); do
    if ! kill -0 $master 2>/dev/null; then echo "mooncake harness: mooncake_master exited:" >&2; tail -20 "$log" >&2; exit 1; fi
    (exec 3<>/dev/tcp/127.0.0.1/"$rpc") 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/"$http") 2>/dev/null && break
    sleep 0.1
  done
  export UCM_MOONCAKE_MASTER="127.0.0.1:$rpc" UCM_MOONCAKE_METADATA="http://127.0.0.1:$http/metadata"
fi
# The command in a process group of its own: everything it starts (masters, client processes)
# is in it unless it leaves it, and is killed with it.
setsid "$@" &
cmd=$!
groups+=("$cmd")
rc=0
wait $cmd || rc=$?
exit $rc
