package cli

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
)

// openWorkload indexes --blocks blocks like lookup, then copies the store while the engine
// still has it open: the copy is what a crash (kill -9, power loss with the page cache
// intact) leaves: the last segment active with no footer, the index's latest writes only in
// its WAL, the LOCK file present. Sealed segments, which never change again, are hard-linked
// into the copy, the index is copied by a Pebble checkpoint (consistent although Pebble
// compacts meanwhile), everything else is copied. The engine is then closed cleanly, and Open is
// timed on the clean store (with the memory it holds per block) and on the crash copy (which
// recovers: scans and seals the active segment, replays the index WAL). A sample of the
// blocks that survived in the crash copy is loaded and checked.
type openWorkload struct{}

func (openWorkload) name() string { return "open" }

func (openWorkload) defaults() map[string]string { return metadataDefaults }

func (openWorkload) blocks(cfg benchConfig, _ format.Layout) (int, error) { return metadataBlocks(cfg) }

func (openWorkload) run(env *benchEnv, res *benchResult) error {
	e, err := indexBlocks(env, res)
	if err != nil {
		return err
	}
	crashDir := env.storeDir + "-crash"
	if err := os.RemoveAll(crashDir); err != nil {
		_ = e.Close()
		return err
	}
	defer func() { _ = os.RemoveAll(crashDir) }()
	sealed := map[string]bool{}
	for _, m := range e.Index().Segments() {
		if p, ok := e.SegmentPath(m.Number); ok && m.State == index.SegmentSealed {
			sealed[p] = true
		}
	}
	indexDir := filepath.Join(env.storeDir, engine.IndexDir)
	err = crashCopyDir(env.storeDir, crashDir, sealed, indexDir)
	if err == nil {
		err = e.Index().Checkpoint(filepath.Join(crashDir, engine.IndexDir))
	}
	if cerr := e.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close after indexing: %w", cerr)
	}
	if err != nil {
		return fmt.Errorf("crash copy: %w", err)
	}

	// Clean open.
	e, err = openMeasured(env, env.storeDir, res)
	if err != nil {
		return err
	}
	if err := e.Close(); err != nil {
		return err
	}

	// Open after the crash.
	e, d, err := env.openDir(crashDir)
	if err != nil {
		return fmt.Errorf("open the crash copy: %w", err)
	}
	defer func() { _ = e.Close() }()
	res.OpenCrashSeconds = d.Seconds()
	rep := e.Recovery()
	blocks := e.Stats().Blocks
	res.CrashRecovery = &crashReport{SegmentsRecovered: rep.SegmentsRecovered, TruncatedBytes: rep.TruncatedBytes,
		EntriesDropped: rep.EntriesDropped, OrphansRemoved: rep.OrphansRemoved, Seconds: rep.Duration.Seconds(),
		BlocksAfter: blocks}
	if rep.SegmentsRecovered == 0 {
		res.notes = append(res.notes, "the crash copy needed no segment recovery (no active segment at the copy)")
	}
	if blocks > int64(env.blocks) {
		res.mismatch = fmt.Sprintf("crash copy holds %d blocks, more than the %d dumped", blocks, env.blocks)
		return nil
	}
	if err := checkSample(env, e, 256); err != nil {
		res.mismatch = "crash copy: " + err.Error()
		return nil
	}
	res.Verified = true
	return nil
}

// checkSample loads up to n of the bench's blocks that e reports stored (the first and the
// last ones) and checks their bytes.
func checkSample(env *benchEnv, e *engine.Engine, n int) error {
	var ids []format.BlockID
	for i := 0; i < env.blocks && len(ids) < n/2; i++ {
		ids = append(ids, blockID(i))
	}
	for i := env.blocks - 1; i >= 0 && i >= n/2 && len(ids) < n; i-- {
		ids = append(ids, blockID(i))
	}
	hits := e.Lookup(ids)
	var stored []format.BlockID
	for i, h := range hits {
		if h {
			stored = append(stored, ids[i])
		}
	}
	bufs := make([][]byte, len(stored))
	for i := range bufs {
		bufs[i] = devio.AlignedBuffer(int(e.Layout().BlockBytes()))
	}
	if err := e.Load(stored, bufs).Wait(); err != nil {
		return err
	}
	for i, id := range stored {
		if err := env.payload.check(bufs[i], id); err != nil {
			return err
		}
	}
	return nil
}

// crashCopyDir copies the directory tree src to dst, hard-linking the files in link (which
// must not change any more), leaving out the tree skip and copying the others.
func crashCopyDir(src, dst string, link map[string]bool, skip string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == skip {
			return filepath.SkipDir
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if link[p] {
			return os.Link(p, target)
		}
		return copyFile(p, target)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
