package benchcheck

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func baseline(cases ...Case) *Baseline {
	return &Baseline{Command: "ucm-lab bench-check", Date: "d", Machine: "m", Cases: cases}
}

func verdicts(rows []Row) map[string]string {
	m := make(map[string]string, len(rows))
	for _, r := range rows {
		m[r.Case] = r.Verdict
	}
	return m
}

func TestCompareThreshold(t *testing.T) {
	b := baseline(Case{Name: "drop11", Ratio: 1.0}, Case{Name: "drop9", Ratio: 1.0},
		Case{Name: "drop10", Ratio: 0.5}, Case{Name: "up", Ratio: 0.8})
	// Medians of three rounds: 0.89 (11 % below), 0.91 (9 %), 0.45 (10 %), 0.95 (up).
	now := map[string][]float64{"drop11": {0.95, 0.89, 0.5}, "drop9": {0.91, 0.91, 0.91}, "drop10": {0.45}, "up": {0.95},
		"noisy": {1.2, 0.85, 0.8}}
	b.Cases = append(b.Cases, Case{Name: "noisy", Ratio: 1.0})
	rows := Compare(b, now, DefaultTolerance)
	want := map[string]string{"drop11": VerdictDrop, "drop9": VerdictOK, "drop10": VerdictOK, "up": VerdictOK,
		"noisy": VerdictNoisy}
	got := verdicts(rows)
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s: verdict %q, want %q", name, got[name], v)
		}
	}
	if !AnyFailed(rows) {
		t.Error("an 11 % drop did not fail the check")
	}
	if r := rows[0]; r.Change > -0.109 || r.Change < -0.111 {
		t.Errorf("drop11: change %v, want -0.11", r.Change)
	}
	if r := rows[0]; r.Min != 0.5 || r.Max != 0.95 {
		t.Errorf("drop11: rounds %v-%v, want 0.5-0.95", r.Min, r.Max)
	}
	now["drop11"] = []float64{0.91}
	if rows := Compare(b, now, DefaultTolerance); AnyFailed(rows) {
		t.Errorf("drops of at most 10 %%, and a drop of the median with a round at the baseline, failed the check: %+v", rows)
	}
}

func TestCompareMissingAndNew(t *testing.T) {
	b := baseline(Case{Name: "a", Ratio: 1}, Case{Name: "b", Ratio: 1})
	rows := Compare(b, map[string][]float64{"a": {1}, "b": {}, "c": {2}}, DefaultTolerance)
	got := verdicts(rows)
	if got["b"] != VerdictMissing || got["c"] != VerdictNew || got["a"] != VerdictOK {
		t.Fatalf("verdicts %v, want a ok, b MISSING, c new", got)
	}
	if !AnyFailed(rows) {
		t.Error("a missing case did not fail the check")
	}
	if rows := Compare(b, map[string][]float64{"a": {1}, "b": {1}, "c": {2}}, DefaultTolerance); AnyFailed(rows) {
		t.Errorf("a new case failed the check: %+v", rows)
	}
	var sb strings.Builder
	if err := PrintTable(&sb, rows); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"case", "baseline", "now", "rounds", "change", "verdict", "MISSING", "new", "2.000-2.000"} {
		if !strings.Contains(sb.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, sb.String())
		}
	}
}

func TestLoadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "baseline.json")
	b := baseline(Case{Name: "seq/dump/fio", Ratio: 0.93, Rounds: []float64{0.9, 0.93, 0.95}, What: "x"})
	if err := Write(path, b); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Cases[0].Name != "seq/dump/fio" || got.Cases[0].Ratio != 0.93 || got.Command != b.Command {
		t.Fatalf("round trip: %+v", got)
	}
}

func TestLoadMalformed(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, body, field string
	}{
		{"ratio zero", `{"cases":[{"name":"a","ratio":1},{"name":"b","ratio":0}]}`, "cases[1].ratio"},
		{"ratio negative", `{"cases":[{"name":"a","ratio":-1}]}`, "cases[0].ratio"},
		{"ratio a string", `{"cases":[{"name":"a","ratio":"fast"}]}`, "cases.ratio"},
		{"name empty", `{"cases":[{"name":"","ratio":1}]}`, "cases[0].name"},
		{"name repeated", `{"cases":[{"name":"a","ratio":1},{"name":"a","ratio":2}]}`, "cases[1].name"},
		{"no cases", `{"command":"x"}`, "cases"},
		{"unknown field", `{"cases":[{"name":"a","ratio":1,"ratoi":2}]}`, ""},
		{"not json", `cases: [a]`, ""},
		{"trailing data", `{"cases":[{"name":"a","ratio":1}]} {}`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".json")
			if err := os.WriteFile(path, []byte(c.body), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Load(path)
			var fe *FileError
			if !errors.As(err, &fe) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("Load: %v, want a *FileError wrapping ErrMalformed", err)
			}
			if fe.File != path || fe.Field != c.field {
				t.Errorf("error names file %q field %q, want %q and %q", fe.File, fe.Field, path, c.field)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), c.field) {
				t.Errorf("message %q does not name the file and field", err)
			}
		})
	}
	_, err := Load(filepath.Join(dir, "absent.json"))
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "absent.json") {
		t.Errorf("absent file: %v", err)
	}
}

func TestParseGoBench(t *testing.T) {
	out := `goos: linux
BenchmarkTransfer/tokens=16/threads=1/layer/gather-2         	      20	   1234 ns/op	 5.0 xfer-GB/s	0.91 ratio	0.77 ratio-inline
BenchmarkTransfer/tokens=16/threads=1/layer/gather-2         	      20	   1234 ns/op	 5.0 xfer-GB/s	0.91 ratio	0.81 ratio-inline
BenchmarkTransfer/tokens=16/threads=1/layer/scatter          	      20	   1234 ns/op	0.88 ratio-inline
PASS
`
	got, err := ParseGoBench(strings.NewReader(out), "ratio-inline")
	if err != nil {
		t.Fatal(err)
	}
	g := got["BenchmarkTransfer/tokens=16/threads=1/layer/gather"]
	if len(g) != 2 || g[0] != 0.77 || g[1] != 0.81 || Median(g) != 0.79 {
		t.Errorf("gather: %v", g)
	}
	if s := got["BenchmarkTransfer/tokens=16/threads=1/layer/scatter"]; len(s) != 1 || s[0] != 0.88 {
		t.Errorf("scatter: %v", s)
	}
	if _, err := ParseGoBench(strings.NewReader("BenchmarkX-2 20 1 ns/op fast ratio-inline\n"), "ratio-inline"); err == nil {
		t.Error("a non-number before the metric was accepted")
	}
}
