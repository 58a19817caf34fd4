#!/usr/bin/env bash
# GlusterFS harness for the sharing tests (docs/sharing.md): starts glusterd itself, creates a
# one-brick volume on the local disk, FUSE-mounts it twice (two "hosts"), runs the command
# given with UCM_GLUSTER_A and UCM_GLUSTER_B set to the two mount points, and tears everything
# down (unmount, volume stop and delete, glusterd and brick processes killed, directories
# removed) on any exit, failure included. It fails loudly, with glusterd's own words, where
# GlusterFS cannot start; it never skips. Traffic stays on this host.
#
#   bash fuzz/gluster/harness.sh go test -run TestSharedKillWhileReading ./fuzz/
set -euo pipefail

for bin in glusterd gluster mount.glusterfs; do
  command -v "$bin" >/dev/null || { echo "gluster harness: $bin not installed (apt-get install glusterfs-server glusterfs-client)" >&2; exit 1; }
done
[ "$#" -gt 0 ] || { echo "usage: $0 COMMAND..." >&2; exit 2; }

host=$(hostname)
vol="ucmgo-$$-$RANDOM"
work=$(mktemp -d /var/tmp/ucmgo-gluster.XXXXXX) # the brick must be on a real disk, not tmpfs
brick="$work/brick"; mnt_a="$work/mnt-a"; mnt_b="$work/mnt-b"
mkdir -p "$brick" "$mnt_a" "$mnt_b"
started_glusterd=0

log() { echo "gluster harness: $*" >&2; }

teardown() {
  local rc=$?
  set +e
  for m in "$mnt_a" "$mnt_b"; do
    mountpoint -q "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }
  done
  if gluster --mode=script volume info "$vol" >/dev/null 2>&1; then
    timeout 60 gluster --mode=script volume stop "$vol" force >/dev/null 2>&1
    timeout 60 gluster --mode=script volume delete "$vol" >/dev/null 2>&1
  fi
  # The brick process serving our brick, then glusterd if this harness started it.
  pkill -f "glusterfsd.*$vol" 2>/dev/null
  if [ "$started_glusterd" = 1 ]; then
    pkill -x glusterd 2>/dev/null
    sleep 0.5
    pkill -9 -x glusterd 2>/dev/null
    pkill -9 -x glusterfsd 2>/dev/null
    pkill -9 -f 'glusterfs .*--volfile-id' 2>/dev/null
  fi
  rm -rf "$work"
  if [ $rc -ne 0 ]; then log "failed (exit $rc)"; fi
  exit $rc
}
trap teardown EXIT INT TERM

if ! pgrep -x glusterd >/dev/null; then
  glusterd -p "$work/glusterd.pid" --log-file="$work/glusterd.log" || { log "glusterd did not start:"; cat "$work/glusterd.log" >&2 || true; exit 1; }
  started_glusterd=1
fi
for i in $(seq 1 50); do gluster --mode=script peer status >/dev/null 2>&1 && break; sleep 0.2; done
gluster --mode=script peer status >/dev/null 2>&1 || { log "glusterd does not answer:"; tail -20 "$work/glusterd.log" >&2 || true; exit 1; }
# Leftovers of an earlier run killed before its teardown: volumes named like ours.
for v in $(gluster --mode=script volume list 2>/dev/null | grep '^ucmgo-' || true); do
  log "removing leftover volume $v"
  timeout 60 gluster --mode=script volume stop "$v" force >/dev/null 2>&1 || true
  timeout 60 gluster --mode=script volume delete "$v" >/dev/null 2>&1 || true
done

out=$(timeout 60 gluster --mode=script volume create "$vol" "$host:$brick" force 2>&1) || { log "volume create failed: $out"; exit 1; }
out=$(timeout 60 gluster --mode=script volume start "$vol" 2>&1) || { log "volume start failed: $out"; exit 1; }
for m in "$mnt_a" "$mnt_b"; do
  ok=0
  for i in $(seq 1 20); do
    if timeout 30 mount -t glusterfs ${UCM_GLUSTER_MOUNT_OPTS:+-o "$UCM_GLUSTER_MOUNT_OPTS"} "$host:/$vol" "$m" 2>"$work/mount.err" && mountpoint -q "$m"; then ok=1; break; fi
    sleep 0.5
  done
  [ $ok = 1 ] || { log "FUSE mount of $vol on $m failed: $(cat "$work/mount.err")"; exit 1; }
done
log "volume $vol mounted on $mnt_a and $mnt_b"

UCM_GLUSTER_A="$mnt_a" UCM_GLUSTER_B="$mnt_b" "$@"
