package tiers

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/wal"
)

// The layout of a shared tier's path (docs/sharing.md). Every instance sharing the path owns one
// namespace under it and writes nothing outside it:
//
//	<path>/instances/<instance id, 32 hex digits>/LOCK       held by the owner while it runs
//	<path>/instances/<instance id>/MANIFEST                  the owner's published segments
//	<path>/instances/<instance id>/segments/<n>.seg          the owner's segment files
const (
	// InstancesDir holds the namespaces of a shared path.
	InstancesDir = "instances"
	// ManifestFile is a namespace's manifest (format.Manifest).
	ManifestFile = "MANIFEST"
	// manifestTemp is the name a manifest is written under before it is renamed into place.
	manifestTemp = ManifestFile + ".tmp"
)

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
// temporary file, synced, renamed over the previous manifest and the directory synced, so a
// reader sees the old list or the new one, whole, and a crash leaves one of them.
func WriteManifest(fs vfs.FS, nsDir string, m *format.Manifest) error {
	buf, err := format.EncodeManifest(m)
	if err != nil {
		return fmt.Errorf("manifest of %s: %w", nsDir, err)
	}
	if err := wal.ReplaceFile(fs, filepath.Join(nsDir, ManifestFile), filepath.Join(nsDir, manifestTemp), buf); err != nil {
		return fmt.Errorf("manifest of %s: %w", nsDir, err)
	}
	return nil
}

// ReadManifest reads and checks the manifest of namespace nsDir, which must be inst's: one read
// of the whole file, bounded by the largest valid manifest before anything is allocated. It
// returns ErrNoManifest when there is none yet, an error wrapping format.ErrCorrupt for bytes
// that fail a check (a manifest is replaced by rename, so a torn one is corruption) or that
// belong to another instance.
func ReadManifest(fs vfs.FS, nsDir string, inst format.InstanceID) (*format.Manifest, error) {
	path := filepath.Join(nsDir, ManifestFile)
	f, err := fs.Open(path)
	if err != nil {
		if oserror.IsNotExist(err) {
			return nil, fmt.Errorf("%s: %w: %w", path, ErrNoManifest, os.ErrNotExist)
		}
		return nil, fmt.Errorf("read manifest %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", path, err)
	}
	if st.Size() > format.ManifestSize(format.MaxManifestSegments, format.MaxManifestNotes) {
		return nil, fmt.Errorf("read manifest %s: %w: %d bytes, above the largest manifest", path, format.ErrCorrupt, st.Size())
	}
	buf := make([]byte, st.Size())
	if _, err := f.ReadAt(buf, 0); err != nil && !(errors.Is(err, io.EOF) && len(buf) == 0) {
		return nil, fmt.Errorf("read manifest %s: %w", path, err)
	}
	m, err := format.DecodeManifest(buf)
	if err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", path, err)
	}
	if m.Instance != inst {
		return nil, fmt.Errorf("read manifest %s: %w: it names instance %x", path, format.ErrCorrupt, m.Instance)
	}
	return m, nil
}
