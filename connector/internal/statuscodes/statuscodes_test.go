package statuscodes

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// Every file that declares the status codes holds the table's current rendering: a code
// changed in one place only (the header, the Python package or the Go constants) fails here.
func TestFilesAgreeWithTable(t *testing.T) {
	for _, f := range Files() {
		content, err := os.ReadFile(filepath.Join("..", "..", f))
		if err != nil {
			t.Fatal(err)
		}
		want, err := Render(f, content)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(content, want) {
			t.Errorf("%s disagrees with the status code table: run go generate ./connector/", f)
		}
	}
}

// Render names the file and the marker it misses, and leaves the text around the markers as
// it was.
func TestRender(t *testing.T) {
	if _, err := Render("python/ucmgo/_lib.py", []byte("OK = 0\n")); err == nil {
		t.Fatal("a file without markers rendered")
	}
	if _, err := Render("other.txt", nil); err == nil {
		t.Fatal("a file that declares no codes rendered")
	}
	tg := targets["capi/ucmgo.h"]
	in := []byte("before\n" + tg.begin + "\nstale\n" + tg.end + "\nafter\n")
	out, err := Render("capi/ucmgo.h", in)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(out, []byte("before\n"+tg.begin+"\nenum {\n")) || !bytes.HasSuffix(out, []byte("};\n"+tg.end+"\nafter\n")) ||
		bytes.Contains(out, []byte("stale")) || !bytes.Contains(out, []byte("UCMGO_ETIMEOUT = -50010,")) {
		t.Fatalf("rendered:\n%s", out)
	}
}

// Codes are UCM's: OK, ERROR, then -50000 down by one, with unique names.
func TestCodesAreUCMs(t *testing.T) {
	seen := map[string]bool{}
	for i, c := range Codes {
		want := int32(-50000 - (i - 2))
		switch i {
		case 0:
			want = 0
		case 1:
			want = -1
		}
		if c.Value != want || seen[c.Name] {
			t.Fatalf("code %d: %+v (want value %d, a new name)", i, c, want)
		}
		seen[c.Name] = true
	}
}
