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

// inflightReader returns a function reading the requests in flight (reads, writes) on the
// block device holding dir (/sys/dev/block/MAJ:MIN/inflight), one closing it, and the
// device's name; nil where there is none (a file system without a block device).
func inflightReader(dir string) (read func() (reads, writes int, ok bool), closeFn func(), name string) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return nil, nil, ""
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	f, err := os.Open(filepath.Join("/sys/dev/block", dev, "inflight"))
	if err != nil {
		return nil, nil, ""
	}
	name = dev
	if link, err := os.Readlink(filepath.Join("/sys/dev/block", dev)); err == nil {
		name = filepath.Base(link)
	}
	buf := make([]byte, 64)
	return func() (int, int, bool) {
		n, err := f.ReadAt(buf, 0)
		if n == 0 && err != nil {
			return 0, 0, false
		}
		var r, w int
		if _, err := fmt.Sscan(string(buf[:n]), &r, &w); err != nil {
			return 0, 0, false
		}
		return r, w, true
	}, func() { _ = f.Close() }, name
}
