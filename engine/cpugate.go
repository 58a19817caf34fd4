package engine

import "runtime"

// cpuGate bounds the dump tasks doing CPU work on payloads at once (checksums, copies into
// staging buffers, compression) to the number of Ps, first come first served, and has each
// yield between blocks.
//
// Without it every dump task computes its checksums at once: dozens of CPU-bound goroutines
// queue in front of the few that keep the device busy (the log's committer and publisher,
// the I/O completions), and on a 2-CPU machine the committer was measured waiting 25 ms to
// take appends that were ready while the device sat idle. With the gate at most GOMAXPROCS
// tasks are runnable for CPU work, each finishes its blocks before the next starts (so the
// first appends come after one task's checksums, not after everyone's), and the yield after
// each block lets waiting I/O goroutines run within one block's checksum (~0.2 ms for 2 MiB).
type cpuGate chan struct{}

func newCPUGate() cpuGate { return make(cpuGate, runtime.GOMAXPROCS(0)) }

// enter waits for a turn.
func (g cpuGate) enter() { g <- struct{}{} }

// leave ends the turn.
func (g cpuGate) leave() { <-g }

// yield lets other runnable goroutines (I/O ones first: the gate keeps CPU-bound tasks few)
// run before the caller goes on with its turn.
func (g cpuGate) yield() { runtime.Gosched() }
