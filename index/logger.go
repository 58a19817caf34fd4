package index

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"syscall"

	"github.com/cockroachdb/pebble/v2"
)

// pebbleLogger routes Pebble's log lines to a *slog.Logger (Pebble prints to stdout otherwise).
type pebbleLogger struct{ log *slog.Logger }

func (l pebbleLogger) Infof(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(fmt.Sprintf(format, args...), "component", "pebble")
	}
}

func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error(fmt.Sprintf(format, args...), "component", "pebble")
}

// Fatalf logs and panics with a *pebbleFatal: Pebble calls it when it must not continue (a
// failed WAL or MANIFEST write, a broken invariant; its own default logger exits the process).
// The Index methods that reach Pebble's write paths recover that panic on the calling
// goroutine and put the index in its failed state (Index.Failed): an embedded engine must not
// take down its host process. A Fatalf on one of Pebble's own background goroutines (a
// MANIFEST write during a flush or compaction) cannot be recovered and still ends the process
// (docs/durability.md).
func (l pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.log.Error(msg, "component", "pebble", "fatal", true)
	panic(&pebbleFatal{msg: msg})
}

// pebbleFatal is the panic value of pebbleLogger.Fatalf.
type pebbleFatal struct{ msg string }

func (f *pebbleFatal) String() string { return "index: pebble fatal: " + f.msg }

// fatalError returns the error of a recovered pebbleFatal panic; any other panic value is
// raised again.
func fatalError(r any) error {
	f, ok := r.(*pebbleFatal)
	if !ok {
		panic(r)
	}
	return f.err()
}

// err is the error the index reports for f: wrapping ErrFailed, and syscall.ENOSPC when a full
// file system was the cause (Pebble's messages carry the errno's text).
func (f *pebbleFatal) err() error {
	if strings.Contains(f.msg, syscall.ENOSPC.Error()) {
		return fmt.Errorf("%w: %s: %w", ErrFailed, f.msg, syscall.ENOSPC)
	}
	return fmt.Errorf("%w: %s", ErrFailed, f.msg)
}

// eventListener reports Pebble's background errors, corruption and slow disks to log.
func eventListener(log *slog.Logger) *pebble.EventListener {
	return &pebble.EventListener{
		BackgroundError: func(err error) {
			log.Error("index: pebble background error", "component", "pebble", "err", err)
		},
		DataCorruption: func(info pebble.DataCorruptionInfo) {
			log.Error("index: pebble data corruption", "component", "pebble", "path", info.Path, "err", info.Details)
		},
		DiskSlow: func(info pebble.DiskSlowInfo) {
			log.Warn("index: slow disk", "component", "pebble", "path", info.Path, "duration", info.Duration)
		},
	}
}
