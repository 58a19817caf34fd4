// Package benchcheck is the comparison half of the lab's performance regression guard
// (`ucm-lab bench-check`, `make bench-check`): a committed baseline file of one ratio per case,
// the comparison of a run's ratios with it, and the table that reports it. The ratios are
// measured by the lab (lab/cmd/ucm-lab/internal/cli/benchcheck.go); this package only reads,
// compares and writes them, so that its rules are tested without running a benchmark.
package benchcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"text/tabwriter"
)

// DefaultTolerance is the fraction by which a ratio may fall below its baseline before the
// check flags it: a drop of more than 10 % fails, 10 % or less passes.
const DefaultTolerance = 0.10

// ErrMalformed is wrapped by every error about a baseline file's content (see *FileError).
var ErrMalformed = errors.New("malformed baseline")

// FileError is a baseline file that could not be used: File is its path, Field the JSON field
// at fault ("" when the file as a whole is unreadable or not JSON). It wraps ErrMalformed for
// content problems and the underlying error (os.ErrNotExist, a JSON syntax error) otherwise.
type FileError struct {
	File  string
	Field string
	Err   error
}

// Error names the file and, when known, the field.
func (e *FileError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("baseline %s: %v", e.File, e.Err)
	}
	return fmt.Sprintf("baseline %s: field %s: %v", e.File, e.Field, e.Err)
}

// Unwrap returns the cause.
func (e *FileError) Unwrap() error { return e.Err }

// Case is one measured ratio: higher is better for every case.
type Case struct {
	// Name identifies the case ("seq/dump/fio", "gather/tokens=16/copy", ...).
	Name string `json:"name"`
	// Ratio is the median over the run's rounds of the case's per-round ratio.
	Ratio float64 `json:"ratio"`
	// Rounds holds each round's ratio, for judging the spread (informational).
	Rounds []float64 `json:"rounds,omitempty"`
	// What says what the ratio is: numerator and denominator, how each was measured.
	What string `json:"what,omitempty"`
}

// Baseline is the committed reference: where it came from and one ratio per case.
type Baseline struct {
	// Command is the command line that produced it.
	Command string `json:"command"`
	// Date is when it was measured (UTC, RFC 3339).
	Date string `json:"date"`
	// Machine describes the host: CPUs, kernel, file system of the bench directory, the load
	// average when the run started and ended.
	Machine string `json:"machine"`
	// Cases are the ratios, one per case name.
	Cases []Case `json:"cases"`
}

// Load reads and validates the baseline file at path. Every problem is a *FileError naming
// path and, for content problems, the field (wrapping ErrMalformed): unknown fields, a missing
// or duplicate case name, a ratio that is not a positive finite number, no cases at all.
func Load(path string) (*Baseline, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &FileError{File: path, Err: err}
	}
	return Parse(path, data)
}

// Parse decodes and validates a baseline file's content; path is used in errors only.
func Parse(path string, data []byte) (*Baseline, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var b Baseline
	if err := dec.Decode(&b); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, &FileError{File: path, Field: te.Field, Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
		}
		return nil, &FileError{File: path, Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
	}
	if dec.More() {
		return nil, &FileError{File: path, Err: fmt.Errorf("%w: data after the JSON object", ErrMalformed)}
	}
	bad := func(field, format string, args ...any) error {
		return &FileError{File: path, Field: field, Err: fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)}
	}
	if len(b.Cases) == 0 {
		return nil, bad("cases", "no cases")
	}
	seen := make(map[string]int, len(b.Cases))
	for i, c := range b.Cases {
		switch {
		case c.Name == "":
			return nil, bad(fmt.Sprintf("cases[%d].name", i), "empty")
		case seen[c.Name] > 0:
			return nil, bad(fmt.Sprintf("cases[%d].name", i), "%q repeats cases[%d]", c.Name, seen[c.Name]-1)
		case math.IsNaN(c.Ratio) || math.IsInf(c.Ratio, 0) || c.Ratio <= 0:
			return nil, bad(fmt.Sprintf("cases[%d].ratio", i), "case %q: %v is not a positive ratio", c.Name, c.Ratio)
		}
		seen[c.Name] = i + 1
	}
	return &b, nil
}

// Write writes b to path as indented JSON (the file `--update` commits).
func Write(path string, b *Baseline) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// Verdicts of a row.
const (
	VerdictOK      = "ok"
	VerdictDrop    = "DROP"    // the median fell by more than the tolerance and every round is below the baseline: fails the check
	VerdictNoisy   = "drop?"   // the median fell by more than the tolerance but a round reached the baseline: reported, passes
	VerdictMissing = "MISSING" // in the baseline but not measured: fails the check
	VerdictNew     = "new"     // measured but not in the baseline: reported, passes
)

// Row is one case's comparison. Now is the median of the case's rounds, Min and Max their
// extremes (the run's own spread: a change inside it says little); Change is Now/Baseline − 1
// (−0.11: 11 % lower), 0 for a missing or new case.
type Row struct {
	Case     string
	Baseline float64
	Now      float64
	Min, Max float64
	Change   float64
	Verdict  string
}

// Failed reports whether the row fails the check.
func (r Row) Failed() bool { return r.Verdict == VerdictDrop || r.Verdict == VerdictMissing }

// Compare compares the measured ratios now (case name → one ratio per round) with the
// baseline's, with tolerance the allowed fractional drop (DefaultTolerance). A case whose
// median ratio is below baseline × (1 − tolerance) is a DROP when every one of its rounds is
// below the baseline too (a regression moves every round), and "drop?" when one reached it (the
// run's own noise spans the baseline: reported, not failed). A baseline case with no ratio in
// now is MISSING, a case of now not in the baseline is new. Rows are in the baseline's order,
// new cases after them by name.
func Compare(base *Baseline, now map[string][]float64, tolerance float64) []Row {
	var rows []Row
	inBase := make(map[string]bool, len(base.Cases))
	measured := func(name string) Row {
		vs := now[name]
		return Row{Case: name, Now: Median(vs), Min: slices.Min(vs), Max: slices.Max(vs)}
	}
	for _, c := range base.Cases {
		inBase[c.Name] = true
		if len(now[c.Name]) == 0 {
			rows = append(rows, Row{Case: c.Name, Baseline: c.Ratio, Verdict: VerdictMissing})
			continue
		}
		r := measured(c.Name)
		r.Baseline, r.Change, r.Verdict = c.Ratio, r.Now/c.Ratio-1, VerdictOK
		if r.Now < c.Ratio*(1-tolerance) {
			r.Verdict = VerdictDrop
			if r.Max >= c.Ratio {
				r.Verdict = VerdictNoisy
			}
		}
		rows = append(rows, r)
	}
	var extra []string
	for name, vs := range now {
		if !inBase[name] && len(vs) > 0 {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	for _, name := range extra {
		r := measured(name)
		r.Verdict = VerdictNew
		rows = append(rows, r)
	}
	return rows
}

// AnyFailed reports whether any row fails the check.
func AnyFailed(rows []Row) bool {
	for _, r := range rows {
		if r.Failed() {
			return true
		}
	}
	return false
}

// PrintTable writes the rows as a table: case, baseline, now (the median), the rounds' range,
// change, verdict.
func PrintTable(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "case\tbaseline\tnow\trounds\tchange\tverdict")
	num := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f", v)
	}
	for _, r := range rows {
		change, spread := "-", "-"
		if r.Verdict == VerdictOK || r.Verdict == VerdictDrop || r.Verdict == VerdictNoisy {
			change = fmt.Sprintf("%+.1f%%", 100*r.Change)
		}
		if r.Verdict != VerdictMissing {
			spread = fmt.Sprintf("%.3f-%.3f", r.Min, r.Max)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Case, num(r.Baseline), num(r.Now), spread, change, r.Verdict)
	}
	return tw.Flush()
}
