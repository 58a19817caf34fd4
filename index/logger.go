package index

import (
	"context"
	"fmt"
	"log/slog"

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

// Fatalf logs and panics: Pebble calls it on broken invariants and must not continue (its own
// default logger exits the process).
func (l pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.log.Error(msg, "component", "pebble", "fatal", true)
	panic("index: pebble fatal: " + msg)
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
