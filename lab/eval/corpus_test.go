package eval

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFile writes body to dir/rel, making its directories.
func writeFile(t *testing.T, dir, rel string, body []byte) string {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, body, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReadTextFile: a text file given by itself is the whole held-out text, whatever its name.
func TestReadTextFile(t *testing.T) {
	p := writeFile(t, t.TempDir(), "notes.md", []byte("# any text\nnot Go at all\n"))
	got, err := ReadText(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Stream) != "# any text\nnot Go at all\n" || got.Files != 1 || got.SkippedBinary != 0 || got.SkippedLarge != 0 {
		t.Fatalf("ReadText(%s) = %+v", p, got)
	}
}

// TestReadTextDir: a directory gives every regular text file under it in path order, with
// binary files (a NUL in the first 8 KiB) and files over MaxFileBytes left out and counted; a
// NUL after the first 8 KiB does not make a file binary, and symlinks are not followed.
func TestReadTextDir(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "b/2.txt", []byte("second\n"))
	writeFile(t, dir, "a.txt", []byte("first\n"))
	writeFile(t, dir, "b/3.py", append(bytes.Repeat([]byte("x"), binarySniffBytes), 0, '\n'))
	writeFile(t, dir, "c/bin.dat", []byte("ELF\x00\x01\x02"))
	writeFile(t, dir, "c/big.txt", bytes.Repeat([]byte("y"), MaxFileBytes+1))
	writeFile(t, dir, "c/edge.txt", bytes.Repeat([]byte("z"), MaxFileBytes))
	if err := os.Symlink(filepath.Join(dir, "a.txt"), filepath.Join(dir, "d-link.txt")); err != nil {
		t.Fatal(err)
	}
	got, err := ReadText(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := "first\nsecond\n" + strings.Repeat("x", binarySniffBytes) + "\x00\n" + strings.Repeat("z", MaxFileBytes)
	if string(got.Stream) != want {
		t.Fatalf("stream of %d bytes, want %d (path order, text files only)", len(got.Stream), len(want))
	}
	if got.Files != 4 || got.SkippedBinary != 1 || got.SkippedLarge != 1 {
		t.Fatalf("files %d, binary %d, large %d; want 4, 1, 1", got.Files, got.SkippedBinary, got.SkippedLarge)
	}
}

// TestReadTextRefuses: a missing path, a directory with no text, an empty file, and a binary
// or oversized file given by itself are errors naming the path.
func TestReadTextRefuses(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope")
	if _, err := ReadText(missing); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing path: %v", err)
	}
	noText := filepath.Join(dir, "bin")
	writeFile(t, noText, "x.dat", []byte{1, 0, 2})
	writeFile(t, noText, "sub/big.txt", bytes.Repeat([]byte("y"), MaxFileBytes+1))
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{noText, empty, writeFile(t, dir, "empty.txt", nil), filepath.Join(noText, "x.dat"), filepath.Join(noText, "sub/big.txt")} {
		if _, err := ReadText(p); !errors.Is(err, ErrNoText) || !strings.Contains(err.Error(), p) {
			t.Errorf("ReadText(%s): %v, want ErrNoText naming it", p, err)
		}
	}
	if os.Getuid() != 0 { // root reads anything
		locked := writeFile(t, dir, "locked/secret.txt", []byte("text\n"))
		if err := os.Chmod(locked, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadText(filepath.Dir(locked)); !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), locked) {
			t.Errorf("unreadable file: %v", err)
		}
	}
}
