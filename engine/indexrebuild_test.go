package engine

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// damageIndex applies damage to the index files of the store in /store.
func damageIndex(t *testing.T, fs vfs.FS, how string) {
	t.Helper()
	dir := "/store/" + IndexDir
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	done := false
	for _, n := range names {
		p := fs.PathJoin(dir, n)
		switch {
		case how == "remove MANIFEST" && strings.HasPrefix(n, "MANIFEST"),
			how == "remove markers" && strings.HasPrefix(n, "marker."),
			how == "remove table" && strings.HasSuffix(n, ".sst"):
			if err := fs.Remove(p); err != nil {
				t.Fatal(err)
			}
			done = true
		case how == "corrupt MANIFEST" && strings.HasPrefix(n, "MANIFEST"),
			how == "corrupt table" && strings.HasSuffix(n, ".sst"):
			patchFile(t, fs, p, 0, func(b []byte) {
				for i := 8; i < len(b); i += 5 {
					b[i] ^= 0xa5
				}
			})
			done = true
		}
	}
	if !done {
		t.Fatalf("%s: no such file in %v", how, names)
	}
}

// TestUnreadableIndexRebuilt: an index Open cannot read (a MANIFEST or a table removed or
// corrupted, its markers removed) is set aside (one copy kept, reported) and rebuilt from the segments: every
// block is served. A read-only or schema-adopting open (the tools) says what to run instead.
func TestUnreadableIndexRebuilt(t *testing.T) {
	for _, how := range []string{"remove MANIFEST", "corrupt MANIFEST", "remove markers", "remove table", "corrupt table"} {
		t.Run(how, func(t *testing.T) {
			_, fs := memFS()
			o := testOptions(fs, mhaLayout)
			e := mustOpen(t, "/store", o)
			stored := ids(0, 70)
			dumpBlocks(t, e, stored)
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			for round := 0; round < 2; round++ {
				// A reopen replays the index's WAL into a table (.sst): every kind of file exists.
				e = mustOpen(t, "/store", o)
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
				damageIndex(t, fs, how)
				ro := o
				ro.ReadOnly, ro.AdoptStoredSchema = true, true
				if _, err := Open("/store", ro); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "read-write with its configuration") {
					t.Fatalf("read-only open of a damaged index: %v", err)
				}
				e = mustOpen(t, "/store", o)
				r := e.Recovery()
				// Without its markers Pebble may also start an empty index in place, which
				// recovery then fills from the segments just the same.
				setAside := r.IndexSetAside == "/store/"+IndexBrokenDir
				if (!setAside && how != "remove markers") || r.SegmentsAdopted == 0 {
					t.Fatalf("recovery %+v: want the index set aside and the segments adopted", r)
				}
				checkBlocks(t, e, stored)
				if err := e.ix.CheckAccounting(); err != nil {
					t.Fatal(err)
				}
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
				names, _ := fs.List("/store")
				kept := 0
				for _, n := range names {
					if strings.HasPrefix(n, IndexDir+".") {
						kept++
					}
				}
				if kept > 1 || (setAside && kept != 1) {
					t.Fatalf("round %d: %d copies of broken indexes kept in %v, want 1", round, kept, names)
				}
			}
		})
	}
}

// TestSchemaFileLetsToolsRebuild: when the index has lost its schema record (here its whole
// WAL: the store never flushed), an open that adopts the stored schema (the tools) takes it
// from SCHEMA: read-only it opens, read-write it indexes the segments again and records the
// schema in the index. A SCHEMA that is not canonical is ignored (the old error then).
func TestSchemaFileLetsToolsRebuild(t *testing.T) {
	_, fs := memFS()
	o := testOptions(fs, mhaLayout)
	e := mustOpen(t, "/store", o)
	stored := ids(0, 40)
	dumpBlocks(t, e, stored)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ := fs.List("/store/" + IndexDir)
	for _, n := range names {
		if strings.HasSuffix(n, ".log") {
			if err := fs.Remove("/store/" + IndexDir + "/" + n); err != nil {
				t.Fatal(err)
			}
		}
	}
	adopt := Options{FS: fs, AdoptStoredSchema: true}
	ro := adopt
	ro.ReadOnly = true
	r, err := Open("/store", ro)
	if err != nil {
		t.Fatalf("read-only open of a store whose index lost its schema record: %v", err)
	}
	if got, want := r.StoredSchema(), testSchema.Canonical(mhaLayout); got != want {
		t.Fatalf("stored schema %q, want %q", got, want)
	}
	_ = r.Close()
	e = mustOpen(t, "/store", adopt)
	if e.Recovery().SegmentsAdopted == 0 {
		t.Fatalf("recovery %+v: segments not adopted", e.Recovery())
	}
	checkBlocks(t, e, stored)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, "/store", o) // the connector's configuration matches what was adopted
	checkBlocks(t, e, stored)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"ucm-schema/1\nmodel=\"x\"\n", testSchema.Canonical(mhaLayout) + "extra line\n"} {
		if _, _, err := parseCanonical(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("parseCanonical(%q): %v, want ErrCorrupt", bad, err)
		}
	}
	if s, l, err := parseCanonical(testSchema.Canonical(mhaLayout)); err != nil || s != testSchema || l != mhaLayout {
		t.Errorf("round trip: %+v %+v %v", s, l, err)
	}
}

// TestSchemaFileGolden pins SCHEMA's bytes (format.md §1): a store writes exactly the golden
// text for the test schema, and it parses back.
func TestSchemaFileGolden(t *testing.T) {
	want, err := os.ReadFile("testdata/schema/SCHEMA.golden")
	if err != nil {
		t.Fatal(err)
	}
	_, fs := memFS()
	s := testSchema
	s.HashScheme, s.Extra = HashSchemeUCMPickle, "tp=\"2\""
	o := testOptions(fs, mhaLayout)
	o.Schema = s
	e := mustOpen(t, "/store", o)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := fs.Open("/store/" + SchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("SCHEMA:\n%s\nwant (testdata/schema/SCHEMA.golden):\n%s", got, want)
	}
	if ps, pl, err := parseCanonical(string(got)); err != nil || ps != s || pl != mhaLayout {
		t.Fatalf("parse back: %+v %+v %v", ps, pl, err)
	}
}
