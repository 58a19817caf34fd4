package connector

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ucm-go/ucm/engine"
)

// cacheJSON is UCM's cache_on_empty configuration (a worker's when device >= 0), with the cache
// directory under root.
func cacheJSON(pipeline, uniqueID string, device int, extra string) string {
	dev := ""
	if device >= 0 {
		dev = fmt.Sprintf(`, "device_id": %d`, device)
	}
	return fmt.Sprintf(`{"store_pipeline": %q, "unique_id": %q, "tensor_size": 16384, "shard_size": 65536,
 "block_size": 65536, "timeout_ms": 10000, "waiting_queue_depth": 16, "running_queue_depth": 1024%s%s}`, pipeline, uniqueID, dev, extra)
}

func openShmStore(t *testing.T, root, text string) *Store {
	t.Helper()
	cfg, err := ParseStoreConfig(text, func(k string) string {
		if k == "UCMGO_SHM_DIR" {
			return root
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// wholeSpans are one span per tensor of each block (block = one shard here), filled with the
// block's pattern when fill.
func wholeSpans(cfg *StoreConfig, ids []engine.BlockID, fill bool) [][][]byte {
	out := make([][][]byte, len(ids))
	for i, id := range ids {
		b := make([]byte, cfg.Layout.ShardBytes)
		if fill {
			copy(b, pattern(id, 0, cfg.Layout.ShardBytes))
		}
		for off := int64(0); off < cfg.Layout.ShardBytes; off += cfg.Tensors[0] {
			out[i] = append(out[i], b[off:off+cfg.Tensors[0]])
		}
	}
	return out
}

func transferWait(t *testing.T, s *Store, load bool, ids []engine.BlockID, spans [][][]byte) ([]bool, error) {
	t.Helper()
	var (
		h   uint64
		err error
	)
	if load {
		h, err = s.Load(ids, make([]int, len(ids)), spans)
	} else {
		h, err = s.Dump(ids, make([]int, len(ids)), spans)
	}
	if err != nil {
		t.Fatal(err)
	}
	failed := make([]bool, len(ids))
	return failed, s.Wait(h, failed)
}

// store_pipeline "Empty": dumps succeed and store nothing, lookups are false, loads fail per
// block as misses (ENOOBJ), the memory is left alone; closing removes its directory.
func TestPipelineEmpty(t *testing.T) {
	root := t.TempDir()
	s := openShmStore(t, root, cacheJSON("Empty", "e", 0, `, "share_buffer_enable": true`))
	sched := openShmStore(t, root, `{"store_pipeline": "Empty"}`)
	cfg := s.Config()
	ids := randomIDs(8)
	if failed, err := transferWait(t, s, false, ids, wholeSpans(cfg, ids, true)); err != nil || anyTrue(failed) {
		t.Fatalf("dump: %v %v", failed, err)
	}
	for _, st := range []*Store{s, sched} {
		if hits, err := st.Lookup(ids); err != nil || anyTrue(hits) {
			t.Fatalf("lookup: %v %v", hits, err)
		}
		if n, err := st.LookupOnPrefix(ids); err != nil || n != -1 {
			t.Fatalf("lookup_on_prefix: %d %v", n, err)
		}
	}
	dst := wholeSpans(cfg, ids, false)
	dst[0][0][0] = 0x5a
	failed, err := transferWait(t, s, true, ids, dst)
	if !errors.Is(err, engine.ErrNotFound) || StatusOf(err) != StatusENoObj || !all(failed) {
		t.Fatalf("load: %v %v", failed, err)
	}
	if dst[0][0][0] != 0x5a {
		t.Fatal("a failed load wrote the caller's memory")
	}
	if err := s.Prefetch(ids); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Stats(); err != nil || st.Blocks != 0 {
		t.Fatalf("stats %+v %v", st, err)
	}
	// Bad input is still refused naming the field.
	if _, err := s.Dump(ids, []int{3}, wholeSpans(cfg, ids, true)); StatusOf(err) != StatusEParam {
		t.Fatalf("bad dump: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sched.Close(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(root); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

func anyTrue(v []bool) bool {
	for _, b := range v {
		if b {
			return true
		}
	}
	return false
}

// store_pipeline "Cache|Empty" shared (UCM's cache_on_empty_test): a worker dumps, the
// scheduler (same unique_id, another instance) finds the blocks, the worker and a second
// worker load them byte for byte. Every store is its own instance on the tmpfs directory of the
// unique_id, removed by the last to close.
func TestPipelineCacheEmptyShared(t *testing.T) {
	root := t.TempDir()
	w := openShmStore(t, root, cacheJSON("Cache|Empty", "job-1", 1, `, "share_buffer_enable": true, "cache_buffer_capacity_gb": 1`))
	sched := openShmStore(t, root, cacheJSON("Cache|Empty", "job-1", -1, `, "share_buffer_enable": true`))
	w2 := openShmStore(t, root, cacheJSON("Cache|Empty", "job-1", 2, `, "share_buffer_enable": true`))
	other := openShmStore(t, root, cacheJSON("Cache|Empty", "job-2", 3, `, "share_buffer_enable": true`))
	dir := filepath.Join(root, "cache-job-1")
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		t.Fatalf("cache directory: %v", err)
	}
	cfg := w.Config()
	if ts := w.Engine().TierStats(); len(ts) != 1 || ts[0].Capacity != min(1<<30, tmpfsBytes(root)) || ts[0].Paths[0] != dir {
		t.Fatalf("tiers %+v", ts)
	}
	ids := randomIDs(16)
	if failed, err := transferWait(t, w, false, ids, wholeSpans(cfg, ids, true)); err != nil || anyTrue(failed) {
		t.Fatalf("dump: %v %v", failed, err)
	}
	if hits, _ := w.Lookup(ids); !all(hits) {
		t.Fatalf("own lookup after wait: %v", hits)
	}
	// Every other instance finds them as soon as the dump's wait returned (publication logs).
	h, _ := sched.Lookup(ids)
	h2, _ := w2.Lookup(ids)
	if !all(h) || !all(h2) {
		t.Fatalf("right after the dump's wait: scheduler hits %v, worker 2 hits %v", h, h2)
	}
	if n, _ := sched.LookupOnPrefix(ids); n != len(ids)-1 {
		t.Fatalf("scheduler prefix %d", n)
	}
	for _, s := range []*Store{w, w2} {
		dst := wholeSpans(cfg, ids, false)
		if failed, err := transferWait(t, s, true, ids, dst); err != nil || anyTrue(failed) {
			t.Fatalf("%s load: %v %v", s.Config().Instance, failed, err)
		}
		for i, id := range ids {
			if !bytes.Equal(bytes.Join(dst[i], nil), pattern(id, 0, cfg.Layout.ShardBytes)) {
				t.Fatalf("%s: block %d differs", s.Config().Instance, i)
			}
		}
	}
	// Another unique_id is another cache.
	if h, _ := other.Lookup(ids); anyTrue(h) {
		t.Fatalf("job-2 sees job-1's blocks: %v", h)
	}
	for i, s := range []*Store{w, sched, w2} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		_, err := os.Stat(dir)
		if gone := errors.Is(err, os.ErrNotExist); gone != (i == 2) {
			t.Fatalf("after %d closes: directory gone %v", i+1, gone)
		}
	}
	if _, err := os.Stat(dir + shmLockSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lock file left: %v", err)
	}
}

// Cache|Empty without share_buffer_enable is private: each store has its own directory, the
// scheduler finds nothing (UCM's unshared cache store has no buffer on the scheduler), and
// closing removes it.
func TestPipelineCacheEmptyPrivate(t *testing.T) {
	root := t.TempDir()
	w := openShmStore(t, root, cacheJSON("Cache|Empty", "job-1", 0, `, "share_buffer_enable": false`))
	w2 := openShmStore(t, root, cacheJSON("Cache|Empty", "job-1", 1, `, "share_buffer_enable": false`))
	cfg := w.Config()
	ids := randomIDs(4)
	if _, err := transferWait(t, w, false, ids, wholeSpans(cfg, ids, true)); err != nil {
		t.Fatal(err)
	}
	dst := wholeSpans(cfg, ids, false)
	if failed, err := transferWait(t, w, true, ids, dst); err != nil || anyTrue(failed) {
		t.Fatalf("load: %v %v", failed, err)
	}
	if !bytes.Equal(bytes.Join(dst[3], nil), pattern(ids[3], 0, cfg.Layout.ShardBytes)) {
		t.Fatal("bytes differ")
	}
	if h, _ := w2.Lookup(ids); anyTrue(h) {
		t.Fatalf("a private cache is seen by another store: %v", h)
	}
	entries, _ := os.ReadDir(root)
	if len(entries) != 4 || !strings.HasPrefix(entries[0].Name(), shmPrivatePrefix) {
		t.Fatalf("entries %v", entries)
	}
	w.Close()
	w2.Close()
	if left, _ := os.ReadDir(root); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// The keys UCM passes with no effect are logged once per store, naming them all.
func TestUnusedKeysLoggedOnce(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, nil)))
	defer slog.SetDefault(prev)
	dir := t.TempDir()
	s := openStore(t, workerJSON(dir, 0, `, "posix_lookup_concurrency": 16, "data_dir_shard_bytes": 3, "waiting_queue_depth": 8`))
	ids := randomIDs(2)
	dumpLayers(t, s, ids, 0)
	s.Lookup(ids)
	s.Close()
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if n := strings.Count(out, "accepted with no effect"); n != 1 {
		t.Fatalf("logged %d times:\n%s", n, out)
	}
	for _, k := range []string{"posix_lookup_concurrency", "data_dir_shard_bytes", "waiting_queue_depth", "local_rank_size", "posix_gc_enable", "unique_id"} {
		if !strings.Contains(out, "ucm_connectors[0]."+k) {
			t.Fatalf("%s not named:\n%s", k, out)
		}
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Without /dev/shm a Cache|Empty store is refused with a clear error naming UCMGO_SHM_DIR; an
// Empty store opens in the temporary directory instead.
func TestPipelineCacheEmptyNoShm(t *testing.T) {
	prev := shmBase
	shmBase = filepath.Join(t.TempDir(), "no-shm")
	defer func() { shmBase = prev }()
	cfg, err := ParseStoreConfig(cacheJSON("Cache|Empty", "x", 0, ""), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(cfg); !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), "UCMGO_SHM_DIR") {
		t.Fatalf("open without /dev/shm: %v", err)
	}
	// An Empty store needs no tmpfs: its empty index goes to the temporary directory.
	t.Setenv("TMPDIR", t.TempDir())
	cfg, err = ParseStoreConfig(`{"store_pipeline": "Empty"}`, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("Empty without /dev/shm: %v", err)
	}
	if !strings.HasPrefix(s.shm.path, filepath.Join(os.TempDir(), "ucmgo", shmEmptyPrefix)) {
		t.Fatalf("Empty store in %s", s.shm.path)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(filepath.Join(os.TempDir(), "ucmgo")); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// A crashed set's cache directory (its users killed, their locks gone with them) is removed by
// the next Cache|Empty store opened under the same root; a live one is not.
func TestPipelineCacheEmptyStaleSwept(t *testing.T) {
	if os.Getenv("UCMGO_SHM_HOLD") != "" {
		cfg, err := ParseStoreConfig(cacheJSON("Cache|Empty", os.Getenv("UCMGO_SHM_HOLD"), 0, ""), os.Getenv)
		if err != nil {
			panic(err)
		}
		if _, err := Open(cfg); err != nil {
			panic(err)
		}
		fmt.Println("open")
		select {} // killed by the parent
	}
	root := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPipelineCacheEmptyStaleSwept$")
	cmd.Env = append(os.Environ(), "UCMGO_SHM_HOLD=crashed", "UCMGO_SHM_DIR="+root)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 4)
	if _, err := out.Read(line); err != nil || string(line) != "open" {
		t.Fatalf("child: %q %v", line, err)
	}
	live := openShmStore(t, root, cacheJSON("Cache|Empty", "live", 0, ""))
	_ = live
	if _, err := os.Stat(filepath.Join(root, "cache-crashed")); err != nil {
		t.Fatalf("a live user's directory was swept: %v", err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	openShmStore(t, root, cacheJSON("Cache|Empty", "next", 1, ""))
	if _, err := os.Stat(filepath.Join(root, "cache-crashed")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a crashed set's directory survived: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "cache-live")); err != nil {
		t.Fatalf("a live store's directory was swept: %v", err)
	}
}
