package eval

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ucm-go/ucm/sparse"
)

// MaxFileBytes is the corpus's file size limit (train.py's --max-file-bytes): larger files
// (generated tables) are left out.
const MaxFileBytes = 256 * 1024

// HeldOutPermille is the share of files held out (train.py's --heldout-permille).
const HeldOutPermille = 20

// IsHeldOut is train.py's split: a file (path relative to GOROOT/src, slash-separated) is held
// out when the first 8 bytes of its path's sha256, as a big-endian integer, mod 1000 are below
// HeldOutPermille.
func IsHeldOut(rel string) bool {
	h := sha256.Sum256([]byte(rel))
	return binary.BigEndian.Uint64(h[:8])%1000 < HeldOutPermille
}

// HeldOutStream returns the held-out files of the model's corpus (every .go file under src,
// outside testdata directories, not a symlink, at most MaxFileBytes, in path order)
// concatenated, as train.py builds its held-out stream, and how many files it holds.
func HeldOutStream(src string) ([]byte, int, error) {
	return corpusStream(src, true)
}

// TrainStream is HeldOutStream's complement: the corpus files train.py trains on (none held
// out), concatenated in path order, and how many files it holds. What is fitted for a sparse
// method (QueryFit) is fitted on it, never on held-out text.
func TrainStream(src string) ([]byte, int, error) {
	return corpusStream(src, false)
}

// corpusStream concatenates the corpus files under src whose IsHeldOut is heldOut.
func corpusStream(src string, heldOut bool) ([]byte, int, error) {
	var paths []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" && p != src {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(d.Name(), ".go") || d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Size() > MaxFileBytes {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if rel = filepath.ToSlash(rel); IsHeldOut(rel) == heldOut {
			paths = append(paths, rel)
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("corpus under %s (held out: %v): %w", src, heldOut, err)
	}
	sort.Strings(paths)
	var out []byte
	for _, rel := range paths {
		b, err := os.ReadFile(filepath.Join(src, filepath.FromSlash(rel)))
		if err != nil {
			return nil, 0, err
		}
		out = append(out, b...)
	}
	return out, len(paths), nil
}

// ErrNoText is returned (wrapped, naming the path) by ReadText when a path holds no text to
// measure on: an empty file, a binary or oversized one, or a directory with no text file.
var ErrNoText = errors.New("no text")

// binarySniffBytes is how much of a file ReadText looks at for a NUL byte, the mark of a
// binary file (as git and grep judge).
const binarySniffBytes = 8 << 10

// Text is held-out text read from a file or a directory (ReadText): the bytes measured on and
// what was left out.
type Text struct {
	// Stream is the text files' contents concatenated in path order.
	Stream []byte
	// Files is the number of files in Stream.
	Files int
	// SkippedBinary counts the files left out for a NUL byte in their first 8 KiB;
	// SkippedLarge those left out for being over MaxFileBytes (train.py's rule).
	SkippedBinary, SkippedLarge int
}

// ReadText reads arbitrary held-out text from path: a regular file, or a directory, whose
// every regular file (symlinks are not followed) is taken in path order and concatenated.
// Binary files (a NUL byte in the first 8 KiB) and files over MaxFileBytes are left out and
// counted, a file given by itself included. It is an error naming the path when path is
// missing or unreadable, and ErrNoText (wrapped, naming the path) when nothing is left.
func ReadText(path string) (Text, error) {
	var t Text
	info, err := os.Stat(path)
	if err != nil {
		return t, fmt.Errorf("held-out text: %w", err)
	}
	var paths []string
	if !info.IsDir() {
		if !info.Mode().IsRegular() {
			return t, fmt.Errorf("held-out text %s: not a regular file or a directory (%s)", path, info.Mode().Type())
		}
		paths = []string{path}
	} else {
		err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Type().IsRegular() {
				paths = append(paths, p)
			}
			return nil
		})
		if err != nil {
			return t, fmt.Errorf("held-out text under %s: %w", path, err)
		}
		sort.Strings(paths)
	}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return t, fmt.Errorf("held-out text: %w", err)
		}
		if fi.Size() > MaxFileBytes {
			t.SkippedLarge++
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return t, fmt.Errorf("held-out text: %w", err)
		}
		if len(b) > MaxFileBytes { // grew since the Stat
			t.SkippedLarge++
			continue
		}
		if bytes.IndexByte(b[:min(len(b), binarySniffBytes)], 0) >= 0 {
			t.SkippedBinary++
			continue
		}
		t.Stream = append(t.Stream, b...)
		t.Files++
	}
	if len(t.Stream) == 0 {
		return t, fmt.Errorf("held-out text %s: %w (%d files read, %d binary and %d over %d bytes left out)",
			path, ErrNoText, t.Files, t.SkippedBinary, t.SkippedLarge, MaxFileBytes)
	}
	return t, nil
}

// Windows cuts n windows of size bytes spread evenly over stream (train.py's heldout_windows:
// window i starts at ⌊i·(len − size)/(n − 1)⌋).
func Windows(stream []byte, size, n int) ([][]byte, error) {
	return windows(stream, size, n, func(i int, span float64) float64 { return float64(i) * span / float64(max(1, n-1)) })
}

// WindowsB is the second held-out split: n windows of size bytes, window i starting at
// ⌊(i + ½)·(len − size)/n⌋, off Windows' starts i·(len − size)/(n − 1). For an even n the
// two splits' starts are at least (len − size)/(2n(n − 1)) apart, so when that is at least size
// (8 windows of 1,025 bytes of the 1.2 MB held-out text: 10.7 KB apart) no window of one split
// overlaps one of the other, and a choice made on Windows can be checked on text it was not
// made on.
func WindowsB(stream []byte, size, n int) ([][]byte, error) {
	return windows(stream, size, n, func(i int, span float64) float64 { return (float64(i) + 0.5) * span / float64(n) })
}

// windows cuts n windows of size bytes from stream, window i starting at ⌊start(i, len − size)⌋.
func windows(stream []byte, size, n int, start func(i int, span float64) float64) ([][]byte, error) {
	if n < 1 || size < 2 || len(stream) < size {
		return nil, fmt.Errorf("%w: %d windows of %d bytes from %d", sparse.ErrInvalid, n, size, len(stream))
	}
	span := float64(len(stream) - size)
	out := make([][]byte, n)
	for i := range n {
		s := int(start(i, span))
		out[i] = stream[s : s+size]
	}
	return out, nil
}
