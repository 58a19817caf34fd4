package devio_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/devio/devtest"
)

func TestParseIOEngine(t *testing.T) {
	for _, e := range []devio.IOEngine{devio.EngineAuto, devio.EngineURing, devio.EnginePsync} {
		got, err := devio.ParseIOEngine(e.String())
		if err != nil || got != e {
			t.Errorf("ParseIOEngine(%q) = %v, %v", e.String(), got, err)
		}
	}
	if _, err := devio.ParseIOEngine("aio"); err == nil {
		t.Error("ParseIOEngine accepted garbage")
	}
}

// newURing returns the io_uring backend, skipping when the tag is off or the
// kernel refuses io_uring (seccomp, io_uring_disabled).
func newURing(t testing.TB, depth int) devio.Backend {
	b, err := devio.NewBackend(devio.EngineURing, depth, nil)
	if !devio.URingCompiled {
		if !errors.Is(err, devio.ErrUnsupported) {
			t.Fatalf("EngineURing without the uring tag: %v, want ErrUnsupported", err)
		}
		t.Skip("io_uring backend not compiled in (needs -tags uring -ldflags=-checklinkname=0)")
	}
	if err != nil {
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOSYS) {
			t.Skipf("io_uring unusable here: %v", err)
		}
		t.Fatalf("EngineURing: %v", err)
	}
	return b
}

func TestNewBackend(t *testing.T) {
	b, err := devio.NewBackend(devio.EnginePsync, 0, nil)
	if err != nil || b.Name() != "psync" {
		t.Fatalf("psync: %v", err)
	}
	b.Close()

	a, err := devio.NewBackend(devio.EngineAuto, 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "psync"
	if devio.URingCompiled {
		want = "uring"
	}
	if a.Name() != want {
		t.Errorf("auto picked %s, want %s", a.Name(), want)
	}
	a.Close()

	u, err := devio.NewBackend(devio.EngineURing, 8, nil)
	if devio.URingCompiled {
		if err != nil {
			t.Fatalf("EngineURing with the tag: %v", err)
		}
		if u.Name() != "uring" {
			t.Errorf("name %s", u.Name())
		}
		u.Close()
	} else if !errors.Is(err, devio.ErrUnsupported) {
		t.Fatalf("EngineURing without the tag: %v, want ErrUnsupported", err)
	}
	if _, err := devio.NewBackend(devio.IOEngine(9), 0, nil); err == nil {
		t.Error("invalid engine accepted")
	}
}

type backendCase struct {
	name string
	mk   func(t testing.TB, depth int) devio.Backend
}

var backendCases = []backendCase{
	{"psync", func(t testing.TB, depth int) devio.Backend {
		b, err := devio.NewBackend(devio.EnginePsync, depth, nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}},
	{"uring", newURing},
}

type fsCase struct {
	name   string
	mk     func(t testing.TB) (vfs.FS, string)
	mode   devio.DirectMode
	direct bool
}

var fsCases = []fsCase{
	{"disk-direct", func(t testing.TB) (vfs.FS, string) { return vfs.Default, diskDir(t) }, devio.DirectOn, true},
	{"disk-buffered", func(t testing.TB) (vfs.FS, string) { return vfs.Default, diskDir(t) }, devio.DirectOff, false},
	{"memfs", func(t testing.TB) (vfs.FS, string) { return vfs.NewCrashableMem(), "" }, devio.DirectAuto, false},
	{"memfs-aligncheck", func(t testing.TB) (vfs.FS, string) {
		return devtest.AlignCheckFS(vfs.NewCrashableMem(), nil), ""
	}, devio.DirectAuto, false},
}

func forEach(t *testing.T, fn func(t *testing.T, b devio.Backend, fs vfs.FS, dir string, fc fsCase)) {
	for _, bc := range backendCases {
		for _, fc := range fsCases {
			t.Run(bc.name+"/"+fc.name, func(t *testing.T) {
				b := bc.mk(t, 8)
				defer b.Close()
				fs, dir := fc.mk(t)
				fn(t, b, fs, dir, fc)
			})
		}
	}
}

func fill(b []byte, seed uint64) {
	var key [32]byte
	for i := range key {
		key[i] = byte(seed >> (8 * (i % 8)))
	}
	_, _ = rand.NewChaCha8(key).Read(b)
}

func TestRoundTripConcurrent(t *testing.T) {
	forEach(t, func(t *testing.T, b devio.Backend, fs vfs.FS, dir string, fc fsCase) {
		f, err := devio.OpenFile(fs, filepath.Join(dir, "data"), true, fc.mode)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if f.Direct() != fc.direct {
			t.Fatalf("Direct=%v want %v", f.Direct(), fc.direct)
		}
		pool := devio.NewBufferPool()
		const (
			goroutines = 16
			iters      = 12
			perBatch   = 5
			region     = 64 << 10 // bytes per op slot
		)
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for it := range iters {
					ops := make([]devio.Op, perBatch)
					for k := range ops {
						slot := int64((g*iters+it)*perBatch + k)
						n := int(devio.AlignUp(int64(1 + (slot*7919)%region)))
						buf := pool.Get(n)
						fill(buf, uint64(slot))
						ops[k] = devio.Op{File: f, Buf: buf, Off: slot * region, Write: true}
					}
					if err := b.Submit(ops); err != nil {
						t.Error(err)
						return
					}
					for k := range ops {
						if ops[k].N != len(ops[k].Buf) || ops[k].Err != nil {
							t.Errorf("write op %d: N=%d Err=%v", k, ops[k].N, ops[k].Err)
						}
					}
					want := make([][]byte, perBatch)
					for k := range ops {
						want[k] = ops[k].Buf
						ops[k] = devio.Op{File: f, Buf: pool.Get(len(want[k])), Off: ops[k].Off}
					}
					if err := b.Submit(ops); err != nil {
						t.Error(err)
						return
					}
					for k := range ops {
						if ops[k].N != len(want[k]) || !bytes.Equal(ops[k].Buf, want[k]) {
							t.Errorf("read back op %d at %d: N=%d, data mismatch=%v", k, ops[k].Off, ops[k].N,
								!bytes.Equal(ops[k].Buf, want[k]))
						}
						pool.Put(ops[k].Buf)
						pool.Put(want[k])
					}
				}
			}()
		}
		wg.Wait()
		if err := f.SyncData(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLargeBatch submits a batch far larger than the queue depth.
func TestLargeBatch(t *testing.T) {
	for _, bc := range backendCases {
		t.Run(bc.name, func(t *testing.T) {
			b := bc.mk(t, 4)
			defer b.Close()
			f, err := devio.OpenFile(vfs.Default, filepath.Join(diskDir(t), "big"), true, devio.DirectOn)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			const n = 300
			buf := devio.AlignedBuffer(n * 4096)
			fill(buf, 42)
			ops := make([]devio.Op, n)
			for i := range ops {
				ops[i] = devio.Op{File: f, Buf: buf[i*4096 : (i+1)*4096], Off: int64(i) * 4096, Write: true}
			}
			if err := b.Submit(ops); err != nil {
				t.Fatal(err)
			}
			got := devio.AlignedBuffer(n * 4096)
			rd := []devio.Op{{File: f, Buf: got}}
			if err := b.Submit(rd); err != nil || rd[0].N != len(got) {
				t.Fatalf("read: %v N=%d", err, rd[0].N)
			}
			if !bytes.Equal(got, buf) {
				t.Fatal("data mismatch")
			}
		})
	}
}

func TestShortReadAtEOF(t *testing.T) {
	forEach(t, func(t *testing.T, b devio.Backend, fs vfs.FS, dir string, fc fsCase) {
		f, err := devio.OpenFile(fs, filepath.Join(dir, "short"), true, fc.mode)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		data := devio.AlignedBuffer(8192)
		fill(data, 1)
		if err := b.Submit([]devio.Op{{File: f, Buf: data, Write: true}}); err != nil {
			t.Fatal(err)
		}
		ops := []devio.Op{
			{File: f, Buf: devio.AlignedBuffer(4096), Off: 4096},      // fully inside
			{File: f, Buf: devio.AlignedBuffer(3 * 4096), Off: 0},     // crosses EOF
			{File: f, Buf: devio.AlignedBuffer(4096), Off: 16 * 4096}, // beyond EOF
		}
		err = b.Submit(ops)
		if !errors.Is(err, io.ErrUnexpectedEOF) || err != ops[1].Err {
			t.Fatalf("Submit = %v, want ops[1].Err wrapping io.ErrUnexpectedEOF", err)
		}
		if ops[0].Err != nil || !bytes.Equal(ops[0].Buf, data[4096:]) {
			t.Errorf("op 0: %v", ops[0].Err)
		}
		if ops[1].N != 8192 || !bytes.Equal(ops[1].Buf[:8192], data) {
			t.Errorf("op 1: N=%d", ops[1].N)
		}
		if !strings.Contains(ops[1].Err.Error(), f.Path()) || !strings.Contains(ops[1].Err.Error(), "offset 0") {
			t.Errorf("op error lacks path/offset: %v", ops[1].Err)
		}
		if ops[2].N != 0 || !errors.Is(ops[2].Err, io.ErrUnexpectedEOF) {
			t.Errorf("op 2: N=%d err=%v", ops[2].N, ops[2].Err)
		}
	})
}

func TestMisalignedDirect(t *testing.T) {
	for _, bc := range backendCases {
		t.Run(bc.name, func(t *testing.T) {
			b := bc.mk(t, 8)
			defer b.Close()
			f, err := devio.OpenFile(vfs.Default, filepath.Join(diskDir(t), "mis"), true, devio.DirectOn)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			buf := devio.AlignedBuffer(3 * 4096)
			for _, write := range []bool{true, false} {
				ops := []devio.Op{
					{File: f, Buf: buf[:4096], Off: 0, Write: write},         // fine
					{File: f, Buf: buf[:4096], Off: 512, Write: write},       // offset
					{File: f, Buf: buf[:4000], Off: 0, Write: write},         // length
					{File: f, Buf: buf[1 : 1+4096], Off: 4096, Write: write}, // address
				}
				err := b.Submit(ops)
				if !errors.Is(err, devio.ErrMisaligned) || err != ops[1].Err {
					t.Fatalf("write=%v: Submit = %v, want ops[1].Err wrapping ErrMisaligned", write, err)
				}
				if ops[0].Err != nil || ops[0].N != 4096 {
					t.Errorf("aligned op failed: %v", ops[0].Err)
				}
				for i := 1; i < len(ops); i++ {
					if !errors.Is(ops[i].Err, devio.ErrMisaligned) || ops[i].N != 0 {
						t.Errorf("op %d: N=%d err=%v", i, ops[i].N, ops[i].Err)
					}
				}
			}
			if fi, err := f.VFS().Stat(); err != nil || fi.Size() != 4096 {
				t.Errorf("misaligned writes reached the file: size %d err %v", fi.Size(), err)
			}
		})
	}
}

func TestAlignCheckThroughBackend(t *testing.T) {
	for _, bc := range backendCases {
		t.Run(bc.name, func(t *testing.T) {
			b := bc.mk(t, 8)
			defer b.Close()
			fs := devtest.AlignCheckFS(vfs.NewCrashableMem(), func(p string) bool { return strings.HasSuffix(p, ".seg") })
			f, err := devio.OpenFile(fs, "x.seg", true, devio.DirectAuto)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Direct() {
				t.Fatal("MemFS file is direct")
			}
			buf := devio.AlignedBuffer(8192)
			err = b.Submit([]devio.Op{{File: f, Buf: buf[:100], Off: 0, Write: true}})
			if !errors.Is(err, devio.ErrMisaligned) {
				t.Fatalf("misaligned write via AlignCheckFS: %v", err)
			}
			if err := b.Submit([]devio.Op{{File: f, Buf: buf, Write: true}}); err != nil {
				t.Fatal(err)
			}
			g, err := devio.OpenFile(fs, "x.log", true, devio.DirectAuto)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if err := b.Submit([]devio.Op{{File: g, Buf: buf[3:103], Off: 7, Write: true}}); err != nil {
				t.Fatalf("unmatched path was checked: %v", err)
			}
		})
	}
}

func TestOpErrorsAndClose(t *testing.T) {
	for _, bc := range backendCases {
		t.Run(bc.name, func(t *testing.T) {
			b := bc.mk(t, 8)
			dir := diskDir(t)
			path := filepath.Join(dir, "ro")
			w, err := devio.OpenFile(vfs.Default, path, true, devio.DirectAuto)
			if err != nil {
				t.Fatal(err)
			}
			w.Close()
			r, err := devio.OpenReadOnly(vfs.Default, path, devio.DirectAuto)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			ops := []devio.Op{{File: r, Buf: devio.AlignedBuffer(4096), Write: true}}
			err = b.Submit(ops)
			if err == nil || !errors.Is(err, syscall.EBADF) || !strings.Contains(err.Error(), path) {
				t.Fatalf("write to read-only file: %v", err)
			}
			// Empty ops and nil-file ops.
			ops = []devio.Op{{File: r}, {}}
			if err := b.Submit(ops); err == nil || ops[0].Err != nil || ops[1].Err == nil {
				t.Fatalf("empty/nil ops: %v / %v / %v", err, ops[0].Err, ops[1].Err)
			}
			if err := b.Submit(nil); err != nil {
				t.Fatal(err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if err := b.Close(); err != nil {
				t.Fatal("second Close:", err)
			}
			if err := b.Submit([]devio.Op{{File: r, Buf: devio.AlignedBuffer(4096)}}); !errors.Is(err, devio.ErrClosed) {
				t.Fatalf("Submit after Close: %v", err)
			}
		})
	}
}

func TestAlignCheckFS(t *testing.T) {
	mem := vfs.NewCrashableMem()
	fs := devtest.AlignCheckFS(mem, nil)
	f, err := fs.Create("f", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if f.Fd() != vfs.InvalidFd {
		t.Fatal("AlignCheckFS exposed an fd for a MemFS file")
	}
	buf := devio.AlignedBuffer(3 * 4096)
	if _, err := f.WriteAt(buf[:8192], 0); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		b    []byte
		off  int64
	}{
		{"offset", buf[:4096], 100},
		{"length", buf[:4095], 0},
		{"address", buf[8 : 8+4096], 0},
	} {
		if _, err := f.WriteAt(c.b, c.off); !errors.Is(err, devio.ErrMisaligned) {
			t.Errorf("WriteAt misaligned %s: %v", c.name, err)
		}
		if _, err := f.ReadAt(c.b, c.off); !errors.Is(err, devio.ErrMisaligned) {
			t.Errorf("ReadAt misaligned %s: %v", c.name, err)
		}
	}
	if _, err := f.ReadAt(buf[4096:8192], 4096); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, open := range []func() (vfs.File, error){
		func() (vfs.File, error) { return fs.Open("f") },
		func() (vfs.File, error) { return fs.OpenReadWrite("f", vfs.WriteCategoryUnspecified) },
		func() (vfs.File, error) { return fs.ReuseForWrite("f", "g", vfs.WriteCategoryUnspecified) },
	} {
		g, err := open()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.ReadAt(buf[:10], 0); !errors.Is(err, devio.ErrMisaligned) {
			t.Errorf("reopened file unchecked: %v", err)
		}
		g.Close()
	}
	if fs.Unwrap() != mem {
		t.Error("Unwrap")
	}
}

// benchFile creates a file on disk (O_DIRECT where supported), closed when b ends.
func benchFile(b *testing.B) *devio.File {
	f, err := devio.OpenFile(vfs.Default, filepath.Join(diskDir(b), "bench"), true, devio.DirectAuto)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return f
}

func BenchmarkSubmit(b *testing.B) {
	for _, bc := range backendCases {
		for _, dir := range []string{"write", "read"} {
			b.Run(fmt.Sprintf("%s/%s-1MiB", bc.name, dir), func(b *testing.B) {
				be := bc.mk(b, 16)
				defer be.Close()
				f := benchFile(b)
				const blocks = 128
				buf := devio.AlignedBuffer(1 << 20)
				fill(buf, 7)
				if dir == "read" {
					for i := range blocks {
						if err := be.Submit([]devio.Op{{File: f, Buf: buf, Off: int64(i) << 20, Write: true}}); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.Logf("direct=%v", f.Direct())
				b.SetBytes(1 << 20)
				b.ResetTimer()
				for i := range b.N {
					op := []devio.Op{{File: f, Buf: buf, Off: int64(i%blocks) << 20, Write: dir == "write"}}
					if err := be.Submit(op); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkSubmitRecords writes batches of 16 records laid out as the log lays them out (a
// 4 KiB header, then a 64 KiB payload, record after record: adjacent ops the backends merge
// into vectored requests) against the same ops with a 4 KiB gap after each (nothing to merge).
func BenchmarkSubmitRecords(b *testing.B) {
	for _, bc := range backendCases {
		for _, layout := range []string{"adjacent", "gapped"} {
			b.Run(bc.name+"/"+layout, func(b *testing.B) {
				be := bc.mk(b, 64)
				defer be.Close()
				f := benchFile(b)
				const records, header, payload = 16, 4 << 10, 64 << 10
				gap := int64(0)
				if layout == "gapped" {
					gap = 4 << 10
				}
				hdr, body := devio.AlignedBuffer(header), devio.AlignedBuffer(payload)
				fill(body, 3)
				stride := int64(header+payload) + gap
				ops := make([]devio.Op, 0, 2*records)
				b.SetBytes(records * (header + payload))
				for i := 0; b.Loop(); i++ {
					ops = ops[:0]
					base := int64(i%64) * records * stride
					for r := range int64(records) {
						off := base + r*stride
						ops = append(ops, devio.Op{File: f, Buf: hdr, Off: off, Write: true},
							devio.Op{File: f, Buf: body, Off: off + header, Write: true})
					}
					if err := be.Submit(ops); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestAdjacentOps submits batches whose ops continue each other in one file (a record header
// and its payload, consecutive records), which the backends issue as vectored requests, and
// checks every op's bytes and outcome as if it had been issued alone.
func TestAdjacentOps(t *testing.T) {
	forEach(t, func(t *testing.T, b devio.Backend, fs vfs.FS, dir string, fc fsCase) {
		f, err := devio.OpenFile(fs, filepath.Join(dir, "adjacent"), true, fc.mode)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		// 40 records of a 4 KiB header and a 64 KiB payload, then one op after a gap.
		var ops []devio.Op
		off := int64(0)
		for i := range 40 {
			for _, n := range []int{4096, 64 << 10} {
				buf := devio.AlignedBuffer(n)
				fill(buf, uint64(len(ops)))
				ops = append(ops, devio.Op{File: f, Buf: buf, Off: off, Write: true})
				off += int64(n)
			}
			if i == 20 {
				off += 8192 // a hole: the run before it ends there
			}
		}
		if err := b.Submit(ops); err != nil {
			t.Fatal(err)
		}
		reads := make([]devio.Op, len(ops))
		for i, op := range ops {
			if op.N != len(op.Buf) || op.Err != nil {
				t.Fatalf("write op %d: N=%d Err=%v", i, op.N, op.Err)
			}
			reads[i] = devio.Op{File: f, Buf: devio.AlignedBuffer(len(op.Buf)), Off: op.Off}
		}
		if err := b.Submit(reads); err != nil {
			t.Fatal(err)
		}
		for i := range reads {
			if reads[i].N != len(ops[i].Buf) || !bytes.Equal(reads[i].Buf, ops[i].Buf) {
				t.Fatalf("read op %d at %d: N=%d, bytes differ", i, reads[i].Off, reads[i].N)
			}
		}
		// One read of everything sees the records in place and the hole as zeros.
		whole := []devio.Op{{File: f, Buf: devio.AlignedBuffer(int(off)), Off: 0}}
		if err := b.Submit(whole); err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			if !bytes.Equal(whole[0].Buf[op.Off:op.Off+int64(len(op.Buf))], op.Buf) {
				t.Fatalf("op at %d not in place", op.Off)
			}
		}
	})
}

// TestAdjacentOpsAtEOF reads a run of adjacent ops that crosses the end of the file: the ops
// inside it complete, the one crossing it is short, the one past it reads nothing, each with
// its own error, exactly as when issued alone.
func TestAdjacentOpsAtEOF(t *testing.T) {
	forEach(t, func(t *testing.T, b devio.Backend, fs vfs.FS, dir string, fc fsCase) {
		f, err := devio.OpenFile(fs, filepath.Join(dir, "eof"), true, fc.mode)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		data := devio.AlignedBuffer(3 * 4096)
		fill(data, 7)
		if err := b.Submit([]devio.Op{{File: f, Buf: data, Write: true}}); err != nil {
			t.Fatal(err)
		}
		ops := []devio.Op{
			{File: f, Buf: devio.AlignedBuffer(2 * 4096), Off: 0},
			{File: f, Buf: devio.AlignedBuffer(2 * 4096), Off: 2 * 4096}, // the file ends 4 KiB into it
			{File: f, Buf: devio.AlignedBuffer(4096), Off: 4 * 4096},     // past the end
		}
		err = b.Submit(ops)
		if !errors.Is(err, io.ErrUnexpectedEOF) || err != ops[1].Err {
			t.Fatalf("Submit = %v, want ops[1]'s ErrUnexpectedEOF", err)
		}
		if ops[0].Err != nil || ops[0].N != 2*4096 || !bytes.Equal(ops[0].Buf, data[:2*4096]) {
			t.Errorf("op 0: N=%d Err=%v", ops[0].N, ops[0].Err)
		}
		if ops[1].N != 4096 || !bytes.Equal(ops[1].Buf[:4096], data[2*4096:]) || !strings.Contains(ops[1].Err.Error(), "offset 8192") {
			t.Errorf("op 1: N=%d Err=%v", ops[1].N, ops[1].Err)
		}
		if ops[2].N != 0 || !errors.Is(ops[2].Err, io.ErrUnexpectedEOF) || !strings.Contains(ops[2].Err.Error(), "offset 16384") {
			t.Errorf("op 2: N=%d Err=%v", ops[2].N, ops[2].Err)
		}
	})
}

// TestAdjacentOpsFail writes a run of adjacent ops to a read-only file: the vectored request
// fails and every op reports the failure under its own offset.
func TestAdjacentOpsFail(t *testing.T) {
	for _, bc := range backendCases {
		t.Run(bc.name, func(t *testing.T) {
			b := bc.mk(t, 8)
			defer b.Close()
			path := filepath.Join(diskDir(t), "ro")
			w, err := devio.OpenFile(vfs.Default, path, true, devio.DirectOn)
			if err != nil {
				t.Fatal(err)
			}
			_ = w.Close()
			f, err := devio.OpenReadOnly(vfs.Default, path, devio.DirectOn)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			ops := make([]devio.Op, 3)
			for i := range ops {
				ops[i] = devio.Op{File: f, Buf: devio.AlignedBuffer(4096), Off: int64(i) * 4096, Write: true}
			}
			if err := b.Submit(ops); err == nil {
				t.Fatal("write to a read-only file succeeded")
			}
			for i, op := range ops {
				if op.Err == nil || op.N != 0 || !errors.Is(op.Err, syscall.EBADF) ||
					!strings.Contains(op.Err.Error(), fmt.Sprintf("offset %d ", i*4096)) {
					t.Errorf("op %d: N=%d Err=%v, want EBADF at its own offset", i, op.N, op.Err)
				}
			}
		})
	}
}
