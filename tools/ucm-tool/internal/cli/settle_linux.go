package cli

import "golang.org/x/sys/unix"

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
