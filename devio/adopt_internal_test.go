//go:build linux && uring

package devio

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// adoptBackend returns an io_uring backend of the given depth, skipping where io_uring is
// refused.
func adoptBackend(t *testing.T, depth int) *uringBackend {
	t.Helper()
	b, err := newURing(depth)
	if err != nil {
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOSYS) {
			t.Skipf("io_uring unusable here: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b.(*uringBackend)
}

// adoptFile returns a file holding data (direct where the file system allows it).
func adoptFile(t *testing.T, data []byte) *File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := OpenFile(vfs.Default, path, false, DirectAuto)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// queued runs Submits one after another while the backend's only token is held, each started
// once the previous one's units are offered, then releases the token: the first Submit gets
// it and finds the others' units waiting behind it.
func queued(t *testing.T, b *uringBackend, batches [][]Op) []error {
	t.Helper()
	hold := b.tokens.join()
	if got := b.tokens.take(hold, b.depth); got != b.depth {
		t.Fatalf("took %d of %d tokens", got, b.depth)
	}
	errs := make([]error, len(batches))
	var wg sync.WaitGroup
	for i, ops := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.Submit(ops)
		}()
		deadline := time.Now().Add(10 * time.Second)
		for int(b.adoptions.n.Load()) < i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("batch %d was never offered", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	b.tokens.release(b.depth)
	b.tokens.leave(hold)
	wg.Wait()
	return errs
}

func pattern(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestAdoptReads queues three Submits reading consecutive ranges: the first issues all three
// as one request, and each gets its own bytes.
func TestAdoptReads(t *testing.T) {
	b := adoptBackend(t, 1)
	const piece = 64 << 10
	data := pattern(3*piece, 1)
	f := adoptFile(t, data)
	var batches [][]Op
	for i := range 3 {
		// Two ops per Submit: each unit is itself a merged run.
		batches = append(batches, []Op{
			{File: f, Buf: AlignedBuffer(piece / 2), Off: int64(i * piece)},
			{File: f, Buf: AlignedBuffer(piece / 2), Off: int64(i*piece + piece/2)},
		})
	}
	for i, err := range queued(t, b, batches) {
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
	}
	for i, ops := range batches {
		for j, op := range ops {
			off := i*piece + j*piece/2
			if op.N != piece/2 || !bytes.Equal(op.Buf, data[off:off+piece/2]) {
				t.Errorf("batch %d op %d: N=%d, bytes equal %v", i, j, op.N, bytes.Equal(op.Buf, data[off:off+piece/2]))
			}
		}
	}
	if got := b.adopted.Load(); got != 2 {
		t.Errorf("adopted %d units, want 2 (the second and third Submits')", got)
	}
	if n := b.adoptions.n.Load(); n != 0 {
		t.Errorf("%d offers left behind", n)
	}
}

// TestAdoptWrites does the same with writes, then reads the file back.
func TestAdoptWrites(t *testing.T) {
	b := adoptBackend(t, 1)
	const piece = 32 << 10
	f := adoptFile(t, make([]byte, 4*piece))
	data := pattern(4*piece, 2)
	var batches [][]Op
	for i := range 4 {
		buf := AlignedBuffer(piece)
		copy(buf, data[i*piece:])
		batches = append(batches, []Op{{File: f, Buf: buf, Off: int64(i * piece), Write: true}})
	}
	for i, err := range queued(t, b, batches) {
		if err != nil || batches[i][0].N != piece {
			t.Fatalf("batch %d: N=%d err %v", i, batches[i][0].N, err)
		}
	}
	if got := b.adopted.Load(); got != 3 {
		t.Errorf("adopted %d units, want 3", got)
	}
	back := AlignedBuffer(4 * piece)
	if err := b.Submit([]Op{{File: f, Buf: back}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, data) {
		t.Error("the file does not hold what the adopted writes wrote")
	}
}

// TestAdoptShortRead has an adopted read run past the end of the file: the adopter's own read
// succeeds, and the adopted ops get what they would have got alone (the bytes that exist,
// then io.ErrUnexpectedEOF naming their offset).
func TestAdoptShortRead(t *testing.T) {
	b := adoptBackend(t, 1)
	const piece = 16 << 10
	data := pattern(3*piece+piece/2, 3) // the third Submit's range is half there
	f := adoptFile(t, data)
	var batches [][]Op
	for i := range 4 {
		batches = append(batches, []Op{{File: f, Buf: AlignedBuffer(piece), Off: int64(i * piece)}})
	}
	errs := queued(t, b, batches)
	for i := range 3 {
		op := batches[i][0]
		if errs[i] != nil || op.N != piece || !bytes.Equal(op.Buf, data[i*piece:(i+1)*piece]) {
			t.Errorf("batch %d: N=%d err %v", i, op.N, errs[i])
		}
	}
	if op := batches[3][0]; !errors.Is(errs[3], io.ErrUnexpectedEOF) || op.N != piece/2 ||
		!bytes.Equal(op.Buf[:piece/2], data[3*piece:]) {
		t.Errorf("batch 3 (half past the end): N=%d err %v, want %d bytes and ErrUnexpectedEOF", op.N, errs[3], piece/2)
	}
	if got := b.adopted.Load(); got != 3 {
		t.Errorf("adopted %d units, want 3", got)
	}
}

// TestAdoptFailedWrite has the adopting request fail (the file is read-only): each adopted op
// is retried alone and reports the failure under its own offset.
func TestAdoptFailedWrite(t *testing.T) {
	b := adoptBackend(t, 1)
	f := adoptFile(t, make([]byte, 3*4096))
	ro, err := OpenReadOnly(vfs.Default, f.path, DirectAuto)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	var batches [][]Op
	for i := range 3 {
		batches = append(batches, []Op{{File: ro, Buf: AlignedBuffer(4096), Off: int64(i * 4096), Write: true}})
	}
	for i, err := range queued(t, b, batches) {
		if op := batches[i][0]; !errors.Is(err, syscall.EBADF) || op.N != 0 {
			t.Errorf("batch %d: N=%d err %v, want EBADF", i, op.N, err)
		}
	}
	if got := b.adopted.Load(); got != 2 {
		t.Errorf("adopted %d units, want 2", got)
	}
}

// TestAdoptConcurrent has many goroutines write and read back consecutive ranges of one file
// through a shallow queue, so that units are adopted at random; every byte must land where its
// op said. Run it under the race detector.
func TestAdoptConcurrent(t *testing.T) {
	b := adoptBackend(t, 2)
	const pieces, piece = 256, 8 << 10
	f := adoptFile(t, make([]byte, pieces*piece))
	data := pattern(pieces*piece, 4)
	run := func(write bool) [][]Op {
		batches := make([][]Op, pieces)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < pieces; i += 8 {
					buf := AlignedBuffer(piece)
					if write {
						copy(buf, data[i*piece:])
					}
					ops := []Op{{File: f, Buf: buf, Off: int64(i * piece), Write: write}}
					if err := b.Submit(ops); err != nil || ops[0].N != piece {
						t.Errorf("piece %d: N=%d err %v", i, ops[0].N, err)
					}
					batches[i] = ops
				}
			}()
		}
		wg.Wait()
		return batches
	}
	run(true)
	for i, ops := range run(false) {
		if !bytes.Equal(ops[0].Buf, data[i*piece:(i+1)*piece]) {
			t.Fatalf("piece %d reads back other bytes", i)
		}
	}
	t.Logf("%d units adopted", b.adopted.Load())
	if n := b.adoptions.n.Load(); n != 0 {
		t.Errorf("%d offers left behind", n)
	}
}
