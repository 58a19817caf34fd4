#!/usr/bin/env bash
# GlusterFS harness for the sharing tests (docs/sharing.md): creates a volume on the local disk
# (one brick, or UCM_GLUSTER_BRICKS of them: a distributed volume, each file on one brick chosen
# by its name's hash), FUSE-mounts it twice (two "hosts"), runs the command given with
# UCM_GLUSTER_A and UCM_GLUSTER_B set to the two mount points and UCM_GLUSTER_BRICK_DIRS to the
# bricks' directories (colon-separated: where a test sees what the volume stores, without a
# client's cache), and on any exit, failure included, removes what this run created and nothing
# else: its two mounts, its volume, the processes serving them (found by this run's own
# directory in their command line, killed by pid), that directory.
#
# Runs may share the machine (several at once, and other GlusterFS users): they share one
# glusterd, the one already running or else one a harness starts. Each run registers under
# $UCM_GLUSTER_STATE (default /run/ucmgo-gluster) while it runs; the last run to leave stops a
# glusterd a harness started (by its pid) if it serves no volume any more, and never stops a
# glusterd it did not start. glusterd's management commands of concurrent runs are serialized
# by a lock file ($UCM_GLUSTER_STATE.lock). A run killed with SIGKILL cannot tear down: its
# volume, mounts and directory stay until removed by hand (umount; gluster volume stop/delete);
# no run removes another's, since a volume another run is using looks the same.
#
# It needs root (glusterd, mount). It fails loudly, with glusterd's own words, where GlusterFS
# cannot start; it never skips. Traffic stays on this host.
#
#   bash fuzz/gluster/harness.sh go test -run TestSharedKillWhileReading ./fuzz/
#   UCM_GLUSTER_BRICKS=2 bash fuzz/gluster/harness.sh sh -c 'df $UCM_GLUSTER_A'
#
# UCM_GLUSTER_DELAY_US=N delays every file operation on the bricks by N µs (GlusterFS's
# delay-gen translator): the latency of a volume served by other hosts, on this one.
set -euo pipefail

log() { echo "gluster harness: $*" >&2; }
die() { log "$*"; exit 1; }

for bin in glusterd gluster mount.glusterfs; do
  command -v "$bin" >/dev/null || die "$bin not installed (make deps, or apt-get install glusterfs-server glusterfs-client)"
done
[ "$#" -gt 0 ] || { echo "usage: $0 COMMAND..." >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root (it starts glusterd and mounts volumes): run as root"
nbricks=${UCM_GLUSTER_BRICKS:-1}
case $nbricks in [1-9]) ;; *) die "UCM_GLUSTER_BRICKS=$nbricks: want a number of bricks from 1 to 9" ;; esac
delay_us=${UCM_GLUSTER_DELAY_US:-0} # each brick file operation's added latency: a volume on other hosts
case $delay_us in *[!0-9]* | '') die "UCM_GLUSTER_DELAY_US=$delay_us: want microseconds" ;; esac

state=${UCM_GLUSTER_STATE:-/run/ucmgo-gluster} # users/<pid>, and glusterd.{pid,start,log} of a glusterd a harness started
lockfile="$state.lock"
host=$(hostname)
vol="ucmgo-$$-$RANDOM"
work=$(mktemp -d /var/tmp/ucmgo-gluster.XXXXXX) # the brick must be on a real disk, not tmpfs
bricks=()
for i in $(seq 1 "$nbricks"); do bricks+=("$work/brick$i"); done
[ "$nbricks" != 1 ] || bricks=("$work/brick")
brick=${bricks[0]} # the first (with one brick, the only) brick
mnt_a="$work/mnt-a"; mnt_b="$work/mnt-b"
mkdir -p "${bricks[@]}" "$mnt_a" "$mnt_b"
registered=0 created=0

# starttime PID prints the process's start time (clock ticks since boot, /proc/PID/stat field
# 22), which with the pid names one process: a pid reused later has another start time. It
# fails when PID is not running (a zombie, killed and not yet reaped, is not running).
starttime() {
  local s f
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  read -r -a f <<<"${s##*) }" # fields 3.. after "pid (comm) "
  [ "${f[0]}" != Z ] || return 1
  echo "${f[19]}"
}

# locked FUNC ARGS... runs FUNC holding the harness lock. The lock is on fd 9, which no process
# started under it keeps (glusterd is started with 9>&-).
locked() {
  local rc=0
  exec 9>>"$lockfile"
  flock 9
  "$@" || rc=$?
  exec 9>&-
  return $rc
}

# gl ARGS... is the gluster CLI in script mode, retried while another transaction (of a user
# other than these harnesses) holds glusterd's cluster lock.
gl() {
  local out=""
  for _ in $(seq 1 30); do
    if out=$(timeout 60 gluster --mode=script "$@" 2>&1); then printf '%s\n' "$out"; return 0; fi
    case $out in
      *"Another transaction"* | *"ocking failed"*) sleep 1 ;;
      *) break ;;
    esac
  done
  printf '%s\n' "$out"
  return 1
}

# harness_glusterd prints the pid of the running glusterd a harness started, if there is one.
harness_glusterd() {
  local pid
  pid=$(cat "$state/glusterd.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(starttime "$pid" || true)" = "$(cat "$state/glusterd.start" 2>/dev/null)" ] && echo "$pid"
}

# prune_users forgets the registrations of runs that ended without their teardown (kill -9).
prune_users() {
  local f p
  for f in "$state"/users/*; do
    [ -e "$f" ] || continue
    p=${f##*/}
    [ "$(starttime "$p" || true)" = "$(cat "$f")" ] || rm -f "$f"
  done
}

# join starts glusterd unless one runs, registers this run and creates and starts its volume.
join() {
  local out pid
  mkdir -p "$state/users"
  prune_users
  harness_glusterd >/dev/null || rm -f "$state/glusterd.pid" "$state/glusterd.start"
  # A glusterd that runs but does not answer may be one the previous run is still stopping
  # (make test-gluster runs the harness twice in a row): wait for it to answer or to be gone.
  for _ in $(seq 1 100); do
    pgrep -x glusterd >/dev/null || break
    gluster --mode=script peer status >/dev/null 2>&1 && break
    sleep 0.2
  done
  if ! pgrep -x glusterd >/dev/null; then
    glusterd -p "$state/glusterd.pid" --log-file="$state/glusterd.log" 9>&- ||
      { log "glusterd did not start:"; cat "$state/glusterd.log" >&2 || true; return 1; }
    for _ in $(seq 1 50); do [ -s "$state/glusterd.pid" ] && break; sleep 0.1; done
    pid=$(cat "$state/glusterd.pid" 2>/dev/null) || { log "glusterd wrote no pid file"; return 1; }
    starttime "$pid" >"$state/glusterd.start" || { log "glusterd exited:"; tail -20 "$state/glusterd.log" >&2 || true; return 1; }
    log "started glusterd (pid $pid)"
  fi
  starttime $$ >"$state/users/$$"
  registered=1
  for _ in $(seq 1 50); do gluster --mode=script peer status >/dev/null 2>&1 && break; sleep 0.2; done
  gluster --mode=script peer status >/dev/null 2>&1 ||
    { log "glusterd does not answer:"; tail -20 "$state/glusterd.log" >&2 || true; return 1; }
  created=1
  out=$(gl volume create "$vol" "${bricks[@]/#/$host:}" force) || { log "volume create failed: $out"; return 1; }
  if [ "$delay_us" != 0 ]; then # GlusterFS's delay-gen translator, above each brick's disk
    for kv in "delay-gen posix" "delay-gen.delay-duration $delay_us" "delay-gen.delay-percentage 100"; do
      out=$(gl volume set "$vol" $kv) || { log "volume set $kv failed: $out"; return 1; } # every fop: enable's default
    done
    log "every file operation on the bricks delayed by $delay_us µs"
  fi
  out=$(gl volume start "$vol") || { log "volume start failed: $out"; return 1; }
}

# leave stops and deletes this run's volume, unregisters it, and if it was the last run and
# the glusterd a harness started serves no volume, stops that glusterd.
leave() {
  local pid vols
  if [ $created = 1 ] && gluster --mode=script volume info "$vol" >/dev/null 2>&1; then
    gl volume stop "$vol" force >/dev/null || log "volume stop $vol failed"
    gl volume delete "$vol" >/dev/null || log "volume delete $vol failed"
  fi
  [ $registered = 1 ] || return 0
  rm -f "$state/users/$$"
  prune_users
  if compgen -G "$state/users/*" >/dev/null; then return 0; fi
  if pid=$(harness_glusterd); then
    vols=$(gluster --mode=script volume list 2>/dev/null | grep -v '^No volumes present' || true)
    if [ -n "$vols" ]; then
      log "leaving glusterd (pid $pid) running: it serves volumes $(echo "$vols" | tr '\n' ' ')"
      return 0
    fi
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do [ "$(starttime "$pid" || true)" = "$(cat "$state/glusterd.start")" ] || break; sleep 0.1; done
    if [ "$(starttime "$pid" || true)" = "$(cat "$state/glusterd.start")" ]; then kill -KILL "$pid" 2>/dev/null; fi
    log "stopped glusterd (pid $pid)"
  fi
  rm -rf "$state"
}

# ours prints the pids of the processes whose command line names this run's directory: the
# brick processes serving its volume, the FUSE clients of its mounts.
ours() { pgrep -f -- "${work//./\\.}/" || true; }

# brick_sockets prints the unix sockets glusterd gave this run's brick processes (-S), which
# neither the volume stop nor the delete removes.
brick_sockets() {
  local p a prev
  for p in $(ours); do
    prev=""
    while IFS= read -r -d '' a; do
      [ "$prev" = -S ] && echo "$a"
      prev=$a
    done 2>/dev/null <"/proc/$p/cmdline"
  done
}

teardown() {
  local rc=$? m p left sock socks b
  set +e
  socks=$(brick_sockets)
  for m in "$mnt_a" "$mnt_b"; do
    mountpoint -q "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }
  done
  locked leave
  # Whatever of ours the unmount and the volume stop left (a client of a lazy unmount).
  for p in $(ours); do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 1 50); do [ -n "$(ours)" ] || break; sleep 0.1; done
  for p in $(ours); do kill -KILL "$p" 2>/dev/null; done
  left=$(ours)
  if [ -n "$left" ]; then log "processes left running: $left"; [ $rc -ne 0 ] || rc=1; fi
  # On failure, what the clients and bricks logged as errors and warnings: a call the volume
  # never answered (a test names the process it left stuck) shows up there.
  if [ $rc -ne 0 ]; then
    for m in "$mnt_a.log" "$mnt_b.log" "${bricks[@]}"; do
      case $m in *.log) ;; *) m=${m#/}; m="/var/log/glusterfs/bricks/${m//\//-}.log" ;; esac
      [ -f "$m" ] || continue
      log "errors and warnings in $m (the last 30):"
      grep -E '\] [EWC] \[' "$m" | tail -30 >&2
    done
  fi
  # glusterd names a brick's log after the brick's path, which is this run's.
  for b in "${bricks[@]}"; do
    b=${b#/}
    rm -f "/var/log/glusterfs/bricks/${b//\//-}.log"
  done
  for sock in $socks; do
    case $sock in /run/gluster/*.socket | /var/run/gluster/*.socket) rm -f "$sock" ;; esac
  done
  rmdir "/run/gluster/vols/$vol" 2>/dev/null
  rm -rf "$work"
  if [ $rc -ne 0 ]; then log "failed (exit $rc)"; fi
  exit $rc
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

locked join

for m in "$mnt_a" "$mnt_b"; do
  ok=0
  opts="log-file=$m.log${UCM_GLUSTER_MOUNT_OPTS:+,$UCM_GLUSTER_MOUNT_OPTS}"
  for _ in $(seq 1 20); do
    if timeout 30 mount -t glusterfs -o "$opts" "$host:/$vol" "$m" 2>"$work/mount.err" && mountpoint -q "$m"; then ok=1; break; fi
    sleep 0.5
  done
  [ $ok = 1 ] || die "FUSE mount of $vol on $m failed: $(cat "$work/mount.err") $(tail -5 "$m.log" 2>/dev/null)"
done
log "volume $vol ($nbricks brick(s)) mounted on $mnt_a and $mnt_b"

# UCM_GLUSTER_BRICK: the (first) brick's directory, where a test sees what the volume stores
# without a client's cache (a file deleted through one mount may stay listed through the other a
# while); UCM_GLUSTER_BRICK_DIRS: every brick's directory, colon-separated.
UCM_GLUSTER_A="$mnt_a" UCM_GLUSTER_B="$mnt_b" UCM_GLUSTER_BRICK="$brick" UCM_GLUSTER_BRICK_DIRS="$(IFS=:; echo "${bricks[*]}")" "$@"
