package cli

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// settleFS commits the file system holding dir (syncfs), so that what was just deleted there
// is freed now, with its discards (a mount with -o discard trims freed blocks at the journal
// commit), not in the middle of the next timed phase. The engine's syncs commit the journal
// within its first milliseconds while fio syncs only at its end: without this, only the engine
// paid for trimming the previous round's files. Best effort.
func settleFS(dir string) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_ = unix.Syncfs(fd)
	_ = unix.Close(fd)
}

// inflightReader returns a function reading the requests in flight on the block device holding
// dir, one closing it, and the device's name; nil where there is none (a file system without a
// block device). It reads the in-flight field of /sys/dev/block/MAJ:MIN/stat: requests from
// their submission to their completion, the depth fio's iodepth sets. The device's `inflight`
// file counts only the requests the driver holds: on this development VM (virtio, mq-deadline)
// it read 0–2 while fio kept 32 writes in flight and `stat` read 30–35.
func inflightReader(dir string) (read func() (int, bool), closeFn func(), name string) {
	path, name := blockStatPath(dir)
	if path == "" {
		return nil, nil, ""
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, ""
	}
	buf := make([]byte, 512)
	return func() (int, bool) {
		n, err := f.ReadAt(buf, 0)
		if n == 0 && err != nil {
			return 0, false
		}
		return parseStatInFlight(buf[:n])
	}, func() { _ = f.Close() }, name
}

// blockStatReader returns a function reading the counters of the block device holding dir, and
// the device's name; nil where there is none.
func blockStatReader(dir string) (read func() (blockCounters, bool), name string) {
	path, name := blockStatPath(dir)
	if path == "" {
		return nil, ""
	}
	return func() (blockCounters, bool) {
		b, err := os.ReadFile(path)
		if err != nil {
			return blockCounters{}, false
		}
		return parseBlockStat(b)
	}, name
}

// blockStatPath returns the stat file of the block device (or partition) holding dir and the
// device's name; "" where dir's file system has no block device (tmpfs, FUSE, NFS).
func blockStatPath(dir string) (path, name string) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", ""
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	path = filepath.Join("/sys/dev/block", dev, "stat")
	if _, err := os.Stat(path); err != nil {
		return "", ""
	}
	name = dev
	if link, err := os.Readlink(filepath.Join("/sys/dev/block", dev)); err == nil {
		name = filepath.Base(link)
	}
	return path, name
}
