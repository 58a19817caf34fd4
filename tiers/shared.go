package tiers

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/wal"
)

// The layout of a shared tier's path (docs/sharing.md). Every instance sharing the path owns one
// namespace under it and writes nothing outside it:
//
//	<path>/instances/<instance id, 32 hex digits>/LOCK       held by the owner while it runs
//	<path>/instances/<instance id>/MANIFEST-<sequence>       the owner's published segments
//	<path>/instances/<instance id>/segments/<n>.seg          the owner's segment files
//	<path>/instances/<instance id>/PUBLOG-<sequence>         the owner's publication log
//
// Each manifest is a new file whose name carries its sequence (20 decimal digits, so names
// sort in sequence order), never a file renamed over another: a network file system client
// caches the name-to-file lookup (GlusterFS's FUSE client for about a second), and a reader of
// a replaced name may keep getting the old file; a directory listing shows the new name. The
// owner deletes the older manifests once the new one is in place.
const (
	// InstancesDir holds the namespaces of a shared path.
	InstancesDir = "instances"
	// ManifestPrefix starts the name of a namespace's manifests (format.Manifest).
	ManifestPrefix = "MANIFEST-"
	// PublogPrefix starts the name of a namespace's publication logs (format.PublogHeader).
	PublogPrefix = "PUBLOG-"
	// manifestTempSuffix marks a manifest being written, before it is renamed to its name.
	manifestTempSuffix = ".tmp"
)

// ManifestName is the file name of a namespace's manifest with sequence seq.
func ManifestName(seq uint64) string { return fmt.Sprintf("%s%020d", ManifestPrefix, seq) }

// parseManifestName returns the sequence of a manifest file name; ok=false for other names.
func parseManifestName(name string) (uint64, bool) {
	digits, found := strings.CutPrefix(name, ManifestPrefix)
	if !found || len(digits) != 20 {
		return 0, false
	}
	seq, err := strconv.ParseUint(digits, 10, 64)
	return seq, err == nil
}

// manifestNames returns the sequences of the manifests in nsDir, in increasing order.
func manifestNames(fs vfs.FS, nsDir string) ([]uint64, error) {
	names, err := fs.List(nsDir)
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	for _, n := range names {
		if seq, ok := parseManifestName(n); ok {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// PublogName is the file name of a namespace's publication log with sequence seq.
func PublogName(seq uint64) string { return fmt.Sprintf("%s%020d", PublogPrefix, seq) }

// PublogNames returns the sequences of the publication logs in nsDir, in increasing order (one
// directory listing); none and no error for a namespace that does not exist.
func PublogNames(fs vfs.FS, nsDir string) ([]uint64, error) {
	names, err := fs.List(nsDir)
	if err != nil {
		if oserror.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("publication logs of %s: %w", nsDir, err)
	}
	var seqs []uint64
	for _, n := range names {
		digits, found := strings.CutPrefix(n, PublogPrefix)
		if !found || len(digits) != 20 {
			continue
		}
		if seq, err := strconv.ParseUint(digits, 10, 64); err == nil {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// LatestManifest returns the sequence of the newest manifest of namespace nsDir (one directory
// listing); ok=false when it has none or does not exist.
func LatestManifest(fs vfs.FS, nsDir string) (seq uint64, ok bool, err error) {
	seqs, err := manifestNames(fs, nsDir)
	if err != nil {
		if oserror.IsNotExist(err) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("manifests of %s: %w", nsDir, err)
	}
	if len(seqs) == 0 {
		return 0, false, nil
	}
	return seqs[len(seqs)-1], true, nil
}

// ErrNoManifest is returned by ReadManifest for a namespace that has published nothing yet.
var ErrNoManifest = errors.New("namespace has no manifest")

// NamespaceDir is the namespace of instance inst under shared path root.
func NamespaceDir(root string, inst format.InstanceID) string {
	return filepath.Join(root, InstancesDir, hex.EncodeToString(inst[:]))
}

// ParseNamespace returns the instance a namespace directory name stands for; ok=false for any
// other name.
func ParseNamespace(name string) (format.InstanceID, bool) {
	var id format.InstanceID
	if len(name) != 2*len(id) {
		return id, false
	}
	if _, err := hex.Decode(id[:], []byte(name)); err != nil || id == (format.InstanceID{}) {
		return id, false
	}
	return id, true
}

// ListNamespaces returns the instances that have a namespace under shared path root (one
// directory listing). A root without namespaces yet gives none and no error.
func ListNamespaces(fs vfs.FS, root string) ([]format.InstanceID, error) {
	names, err := fs.List(filepath.Join(root, InstancesDir))
	if err != nil {
		if oserror.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("shared tier %s: list namespaces: %w", root, err)
	}
	var out []format.InstanceID
	for _, n := range names {
		if id, ok := ParseNamespace(n); ok {
			out = append(out, id)
		}
	}
	return out, nil
}

// WriteManifest publishes m as the manifest of namespace nsDir, atomically: it is written to a
// temporary file, synced, renamed to ManifestName(m.Sequence) and the directory synced, so a
// reader sees the old list or the new one, whole, and a crash leaves one of them; then the
// older manifests are deleted. The sequence is raised above the newest existing manifest's
// when m.Sequence is not (a clock that went back): m.Sequence is set to the one written.
func WriteManifest(fs vfs.FS, nsDir string, m *format.Manifest) error {
	old, err := manifestNames(fs, nsDir)
	if err != nil {
		return fmt.Errorf("manifest of %s: %w", nsDir, err)
	}
	if len(old) > 0 && old[len(old)-1] >= m.Sequence {
		m.Sequence = old[len(old)-1] + 1
	}
	buf, err := format.EncodeManifest(m)
	if err != nil {
		return fmt.Errorf("manifest of %s: %w", nsDir, err)
	}
	path := filepath.Join(nsDir, ManifestName(m.Sequence))
	if err := wal.ReplaceFile(fs, path, path+manifestTempSuffix, buf); err != nil {
		return fmt.Errorf("manifest of %s: %w", nsDir, err)
	}
	for _, seq := range old {
		// Readers that listed an old one and open it after this get ErrNotExist and list again.
		if err := fs.Remove(filepath.Join(nsDir, ManifestName(seq))); err != nil && !oserror.IsNotExist(err) {
			return fmt.Errorf("manifest of %s: remove the previous one: %w", nsDir, err)
		}
	}
	return nil
}

// ReadManifest reads and checks the newest manifest of namespace nsDir, which must be inst's:
// one directory listing and one read of the whole file, bounded by the largest valid manifest
// before anything is allocated. It returns ErrNoManifest when there is none yet, an error
// wrapping format.ErrCorrupt for bytes that fail a check (a manifest is complete before it is
// named, so a torn one is corruption) or that belong to another instance.
func ReadManifest(fs vfs.FS, nsDir string, inst format.InstanceID) (*format.Manifest, error) {
	for attempt := 0; ; attempt++ {
		seqs, err := manifestNames(fs, nsDir)
		if errors.Is(err, syscall.ESTALE) && attempt < 3 {
			continue // the directory's handle went stale (replaced, or cached by another mount): list again
		}
		if err != nil && !oserror.IsNotExist(err) {
			return nil, fmt.Errorf("read manifest in %s: %w", nsDir, err)
		}
		if len(seqs) == 0 {
			return nil, fmt.Errorf("%s: %w: %w", nsDir, ErrNoManifest, os.ErrNotExist)
		}
		m, err := readManifestFile(fs, filepath.Join(nsDir, ManifestName(seqs[len(seqs)-1])), inst)
		if err != nil && oserror.IsNotExist(err) && attempt < 3 {
			continue // replaced between the listing and the open: list again
		}
		return m, err
	}
}

func readManifestFile(fs vfs.FS, path string, inst format.InstanceID) (*format.Manifest, error) {
	var buf []byte
	err := ReadReplaced(fs, path, func(f vfs.File) error {
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if st.Size() > format.ManifestSize(format.MaxManifestSegments, format.MaxManifestNotes) {
			return fmt.Errorf("%w: %d bytes, above the largest manifest", format.ErrCorrupt, st.Size())
		}
		buf = make([]byte, st.Size())
		if _, err := f.ReadAt(buf, 0); err != nil && !(errors.Is(err, io.EOF) && len(buf) == 0) {
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", path, err)
	}
	m, err := format.DecodeManifest(buf)
	if err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", path, err)
	}
	if seq, _ := parseManifestName(filepath.Base(path)); m.Sequence != seq {
		return nil, fmt.Errorf("read manifest %s: %w: it holds sequence %d", path, format.ErrCorrupt, m.Sequence)
	}
	if m.Instance != inst {
		return nil, fmt.Errorf("read manifest %s: %w: it names instance %x", path, format.ErrCorrupt, m.Instance)
	}
	return m, nil
}
