package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ucm-go/ucm/engine"
)

// blockCounters are the cumulative counters of a block device's stat file
// (/sys/dev/block/MAJ:MIN/stat; the kernel's Documentation/block/stat.rst): requests completed,
// 512-byte sectors moved, the weighted milliseconds requests spent in the queue, and flush
// requests (kernels from 5.5; zero before).
type blockCounters struct {
	readIOs, readSectors   uint64
	writeIOs, writeSectors uint64
	inQueueMs              uint64 // field 11: Σ over requests of their time in flight
	flushIOs               uint64 // field 16
}

// parseBlockStat reads a stat file's fields; ok is false when it has fewer than 11 fields or one
// of those read is not a number.
func parseBlockStat(b []byte) (c blockCounters, ok bool) {
	f := strings.Fields(string(b))
	if len(f) < 11 {
		return c, false
	}
	field := func(i int) uint64 {
		if i >= len(f) {
			return 0
		}
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			ok = false
		}
		return n
	}
	ok = true
	c = blockCounters{readIOs: field(0), readSectors: field(2), writeIOs: field(4), writeSectors: field(6),
		inQueueMs: field(10), flushIOs: field(15)}
	return c, ok
}

// ioShape is what one timed phase issued to the device holding the bench directory, from the
// device's counters before and after it: how many requests of what mean size, the flushes
// (fdatasync on a device with a volatile write cache), and the mean number of requests in flight
// (the weighted queue time over the phase's wall time: the depth the device was kept at).
// Everything on the device in that time is counted, the bench's own I/O and any other.
type ioShape struct {
	Device    string  `json:"device"`
	Writes    uint64  `json:"writes"`
	WriteKiB  float64 `json:"write_KiB_per_request,omitempty"`
	Reads     uint64  `json:"reads"`
	ReadKiB   float64 `json:"read_KiB_per_request,omitempty"`
	Flushes   uint64  `json:"flushes"`
	MeanQueue float64 `json:"mean_in_flight"`
}

// shapeOf returns the shape of the I/O between two readings of a device's counters taken wall
// apart.
func shapeOf(device string, a, b blockCounters, wall time.Duration) *ioShape {
	d := func(x, y uint64) uint64 {
		if y < x {
			return 0 // the counters were reset (a device re-attached): nothing to say
		}
		return y - x
	}
	s := &ioShape{Device: device, Writes: d(a.writeIOs, b.writeIOs), Reads: d(a.readIOs, b.readIOs), Flushes: d(a.flushIOs, b.flushIOs)}
	if s.Writes > 0 {
		s.WriteKiB = float64(d(a.writeSectors, b.writeSectors)) * 512 / 1024 / float64(s.Writes)
	}
	if s.Reads > 0 {
		s.ReadKiB = float64(d(a.readSectors, b.readSectors)) * 512 / 1024 / float64(s.Reads)
	}
	if ms := float64(wall) / float64(time.Millisecond); ms > 0 {
		s.MeanQueue = float64(d(a.inQueueMs, b.inQueueMs)) / ms
	}
	return s
}

// ioMeter measures the shape of one phase's I/O (startIOMeter, then end).
type ioMeter struct {
	read  func() (blockCounters, bool)
	name  string
	start blockCounters
	at    time.Time
}

// startIOMeter starts measuring the I/O of the device holding dir; nil (whose end returns nil)
// where there is none to read.
func startIOMeter(dir string) *ioMeter {
	read, name := blockStatReader(dir)
	if read == nil {
		return nil
	}
	c, ok := read()
	if !ok {
		return nil
	}
	return &ioMeter{read: read, name: name, start: c, at: time.Now()}
}

// end returns the shape of the I/O since startIOMeter (nil for a nil meter or an unreadable
// device).
func (m *ioMeter) end() *ioShape {
	if m == nil {
		return nil
	}
	c, ok := m.read()
	if !ok {
		return nil
	}
	return shapeOf(m.name, m.start, c, time.Since(m.at))
}

// String is the shape as one line of the bench's report.
func (s *ioShape) String() string {
	if s == nil {
		return ""
	}
	var parts []string
	if s.Writes > 0 {
		parts = append(parts, fmt.Sprintf("%d writes of %.0f KiB", s.Writes, s.WriteKiB))
	}
	if s.Reads > 0 {
		parts = append(parts, fmt.Sprintf("%d reads of %.0f KiB", s.Reads, s.ReadKiB))
	}
	parts = append(parts, fmt.Sprintf("%d flushes", s.Flushes), fmt.Sprintf("%.1f in flight on average", s.MeanQueue))
	return s.Device + ": " + strings.Join(parts, ", ")
}

// syncInterval returns the dump bytes per fdatasync between two readings of the engine's
// counters (0: none synced): the flush interval of the durable fio job (fioJob.fdatasync).
func syncInterval(before, after engine.Stats) int64 {
	syncs := after.DumpSyncs - before.DumpSyncs
	if syncs <= 0 {
		return 0
	}
	return (after.DumpedBytes - before.DumpedBytes) / syncs
}
