package devio

import (
	"errors"
	"reflect"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// fdFile is a File that claims a descriptor (mergeRuns only looks at hasFd).
func fdFile(fd uintptr) *File { return &File{fd: fd, path: "test"} }

func TestMergeRunsPlans(t *testing.T) {
	if !vectoredIO {
		t.Skip("no vectored I/O on this platform: nothing is merged")
	}
	a, b := fdFile(3), fdFile(4)
	noFd := &File{fd: vfs.InvalidFd, path: "mem"}
	buf := func(n int) []byte { return make([]byte, n) }
	all := func(*Op) bool { return true }
	for _, tc := range []struct {
		name  string
		ops   []Op
		issue func(*Op) bool
		want  []opUnit
	}{
		{"header and payload", []Op{{File: a, Buf: buf(4096), Off: 0, Write: true}, {File: a, Buf: buf(8192), Off: 4096, Write: true}},
			all, []opUnit{{0, 2}}},
		{"gap", []Op{{File: a, Buf: buf(4096), Off: 0}, {File: a, Buf: buf(4096), Off: 8192}}, all, []opUnit{{0, 1}, {1, 2}}},
		{"other file", []Op{{File: a, Buf: buf(4096), Off: 0}, {File: b, Buf: buf(4096), Off: 4096}}, all, []opUnit{{0, 1}, {1, 2}}},
		{"direction", []Op{{File: a, Buf: buf(4096), Off: 0, Write: true}, {File: a, Buf: buf(4096), Off: 4096}}, all, []opUnit{{0, 1}, {1, 2}}},
		{"backwards", []Op{{File: a, Buf: buf(4096), Off: 4096}, {File: a, Buf: buf(4096), Off: 0}}, all, []opUnit{{0, 1}, {1, 2}}},
		{"no descriptor", []Op{{File: noFd, Buf: buf(4096), Off: 0}, {File: noFd, Buf: buf(4096), Off: 4096}}, all, []opUnit{{0, 1}, {1, 2}}},
		{"skipped op splits the run", []Op{{File: a, Buf: buf(4096), Off: 0}, {File: a, Buf: nil, Off: 4096}, {File: a, Buf: buf(4096), Off: 4096}},
			func(op *Op) bool { return len(op.Buf) > 0 }, []opUnit{{0, 1}, {2, 3}}},
		{"byte bound", []Op{{File: a, Buf: buf(maxMergeBytes - 4096), Off: 0}, {File: a, Buf: buf(4096), Off: maxMergeBytes - 4096}, {File: a, Buf: buf(4096), Off: maxMergeBytes}},
			all, []opUnit{{0, 2}, {2, 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mergeRuns(tc.ops, tc.issue); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("mergeRuns = %v, want %v", got, tc.want)
			}
		})
	}

	t.Run("op bound", func(t *testing.T) {
		ops := make([]Op, maxMergeOps+3)
		for i := range ops {
			ops[i] = Op{File: a, Buf: buf(512), Off: int64(i) * 512}
		}
		want := []opUnit{{0, maxMergeOps}, {maxMergeOps, maxMergeOps + 3}}
		if got := mergeRuns(ops, all); !reflect.DeepEqual(got, want) {
			t.Errorf("mergeRuns = %v, want %v", got, want)
		}
	})
}

func TestMergedSettle(t *testing.T) {
	mk := func() []Op {
		return []Op{{Buf: make([]byte, 4096)}, {Buf: make([]byte, 8192)}, {Buf: make([]byte, 4096)}}
	}
	un := opUnit{0, 3}
	for _, tc := range []struct {
		name  string
		n     int
		err   error
		again []int
		ns    []int
	}{
		{"complete", 16384, nil, nil, []int{4096, 8192, 4096}},
		{"short in the middle", 4096 + 100, nil, []int{1, 2}, []int{4096, 100, 0}},
		{"nothing", 0, nil, []int{0, 1, 2}, []int{0, 0, 0}},
		{"error", 16384, errors.New("EIO"), []int{0, 1, 2}, []int{0, 0, 0}},
		{"negative", -5, nil, []int{0, 1, 2}, []int{0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ops := mk()
			again := un.settle(ops, tc.n, tc.err)
			if !reflect.DeepEqual(again, tc.again) {
				t.Errorf("again = %v, want %v", again, tc.again)
			}
			for i, n := range tc.ns {
				if ops[i].N != n || ops[i].Err != nil {
					t.Errorf("op %d: N=%d Err=%v, want N=%d", i, ops[i].N, ops[i].Err, n)
				}
			}
		})
	}
}
