#!/usr/bin/env bash
# stabledev: a block device of steady, known bandwidth, to measure the engine against fio without
# the development VMs' disk noise (docs/performance.md, "A device that holds still").
#
# The device is a loop device over a file in tmpfs (so it is as fast as the loop driver's copy),
# formatted ext4 and mounted, whose reads and writes are capped by the kernel's block throttle
# (cgroup v2 io.max, or v1 blkio.throttle) for the processes `run` starts. Under the cap both the
# engine and fio get exactly the bandwidth they keep queued, minute after minute, so a ratio below
# 1 is the engine's own pipeline leaving the device idle, not the device changing its pace.
#
#   stabledev.sh up [MBPS [SIZE]]   create and mount it (default 1000 MB/s, 8G); needs root
#   stabledev.sh run CMD ARGS...    run CMD in the capped group (e.g. ucm-lab bench --dir MOUNT/b --fio)
#   stabledev.sh down               unmount and remove everything up created
#
# What it is not: a model of any real disk's queueing (the throttle holds requests before the
# device, so queue depth, request size and flushes cost nothing beyond their bytes). It answers
# one question: does the engine keep a steady device busy with its access pattern and its
# durability? The loop driver copies with the CPU (about 2.4 GB/s on a 2-vCPU VM), so keep MBPS
# well below what an unthrottled fio gets from it, or the copy competes with the engine for CPU.
set -Eeuo pipefail

NAME=ucm-stabledev
BASE=/mnt/$NAME
RAM=$BASE-ram
MOUNT=$BASE-fs
STATE=/run/$NAME.state

die() { echo "stabledev: $*" >&2; exit 1; }

cgroup_dir() {
	if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
		echo /sys/fs/cgroup/$NAME
	elif [ -d /sys/fs/cgroup/unified ] && grep -qw io /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null; then
		echo /sys/fs/cgroup/unified/$NAME
	elif [ -d /sys/fs/cgroup/blkio ]; then
		echo /sys/fs/cgroup/blkio/$NAME
	else
		die "no cgroup io (v2) or blkio (v1) controller mounted"
	fi
}

cap() { # cap DIR MAJ:MIN BYTES_PER_S
	local dir=$1 dev=$2 bps=$3 parent
	parent=$(dirname "$dir")
	if [ -f "$parent/cgroup.subtree_control" ]; then # cgroup v2
		echo "+io" > "$parent/cgroup.subtree_control"
		echo "$dev rbps=$bps wbps=$bps" > "$dir/io.max"
	else # v1 blkio
		echo "$dev $bps" > "$dir/blkio.throttle.read_bps_device"
		echo "$dev $bps" > "$dir/blkio.throttle.write_bps_device"
	fi
}

up() {
	local mbps=${1:-1000} size=${2:-8G}
	[ "$(id -u)" = 0 ] || die "up needs root (tmpfs, loop device, mkfs, cgroup)"
	[ ! -e "$STATE" ] || die "already up ($(cat "$STATE")); run down first"
	trap down ERR # a failure half way leaves nothing mounted or attached
	mkdir -p "$RAM" "$MOUNT"
	mount -t tmpfs -o size="$size" "$NAME" "$RAM"
	# Leave tmpfs a little room for its own metadata: the file takes 15/16 of it.
	local bytes
	bytes=$(($(df -B1 --output=size "$RAM" | tail -1) / 16 * 15))
	truncate -s "$bytes" "$RAM/disk"
	local loop
	loop=$(losetup -f --show "$RAM/disk")
	mkfs.ext4 -q -F "$loop"
	mount "$loop" "$MOUNT"
	local dev dir
	dev=$(cat "/sys/block/$(basename "$loop")/dev")
	dir=$(cgroup_dir)
	mkdir -p "$dir"
	cap "$dir" "$dev" $((mbps * 1000000))
	echo "loop=$loop dev=$dev cgroup=$dir mbps=$mbps" > "$STATE"
	trap - ERR
	echo "stabledev: $MOUNT (ext4 on $loop over tmpfs), capped at $mbps MB/s for: $0 run CMD..."
}

run() {
	[ -e "$STATE" ] || die "not up: $0 up first"
	local dir
	dir=$(sed -n 's/.*cgroup=\([^ ]*\).*/\1/p' "$STATE")
	echo $$ > "$dir/cgroup.procs"
	exec "$@"
}

down() { # undoes whatever up did, also when up failed half way
	umount "$MOUNT" 2>/dev/null || true
	if [ -e "$RAM/disk" ]; then
		losetup -j "$RAM/disk" | cut -d: -f1 | while read -r loop; do losetup -d "$loop" || true; done
	fi
	local dir
	if dir=$(cgroup_dir 2>/dev/null); then rmdir "$dir" 2>/dev/null || true; fi
	umount "$RAM" 2>/dev/null || true
	rmdir "$MOUNT" "$RAM" 2>/dev/null || true
	rm -f "$STATE"
}

case "${1:-}" in
up) shift; up "$@" ;;
run) shift; [ $# -gt 0 ] || die "run: no command"; run "$@" ;;
down) down ;;
mount) echo "$MOUNT" ;;
*) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2 ;;
esac
