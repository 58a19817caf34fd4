package model

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestForwardRecomputeKeepAll: keeping every token in every layer is Forward, bit for bit,
// and pick sees the K the cache held before the layer wrote (zero in a fresh cache).
func TestForwardRecomputeKeepAll(t *testing.T) {
	m := trained(t)
	_, prompt := readGolden(t)
	prompt = prompt[:min(len(prompt), 150)]
	c := newCache(t, m, 16, 16)
	var seq Sequence
	want := prefill(t, m, c, &seq, prompt)

	c2 := newCache(t, m, 16, 16)
	var seq2 Sequence
	if err := seq2.Reserve(c2, len(prompt)); err != nil {
		t.Fatal(err)
	}
	calls := 0
	got, rows, err := m.ForwardRecompute(c2, &seq2, toks(prompt), span(0, len(prompt)), func(layer int, rows []int, fresh, cached []float32) ([]int, error) {
		calls++
		if len(rows) != len(prompt) || len(fresh) != len(rows)*m.Config().KVDim() || len(cached) != len(fresh) {
			t.Fatalf("layer %d: %d rows, %d fresh, %d cached", layer, len(rows), len(fresh), len(cached))
		}
		for _, v := range cached {
			if v != 0 {
				t.Fatalf("layer %d: cached K %v in a fresh cache", layer, v)
			}
		}
		return rows, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != m.Config().Layers || len(rows) != len(prompt) || equalBits(got, want) >= 0 {
		t.Fatalf("%d calls, %d rows, logits equal %v", calls, len(rows), equalBits(got, want) < 0)
	}
	if seq2.Len != len(prompt) {
		t.Fatalf("seq.Len %d", seq2.Len)
	}
}

// TestForwardRecomputeExactReuse: when the cache already holds the K/V full recompute writes,
// any recompute subset (containing the last token) gives the last token's logits bit for bit;
// with a zeroed cache the same subset does not (so the check can fail).
func TestForwardRecomputeExactReuse(t *testing.T) {
	m := trained(t)
	_, prompt := readGolden(t)
	prompt = prompt[:min(len(prompt), 150)]
	V := m.Config().Vocab
	c := newCache(t, m, 16, 16)
	var seq Sequence
	full := prefill(t, m, c, &seq, prompt)
	wantLast := full[(len(prompt)-1)*V:]
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(layer int, rows []int, fresh, cached []float32) ([]int, error) {
		var keep []int
		for _, r := range rows {
			if r == len(prompt)-1 || rng.IntN(4) == 0 {
				keep = append(keep, r)
			}
		}
		return keep, nil
	}
	for trial := range 3 {
		seq.Len = len(prompt)
		lg, rows, err := m.ForwardRecompute(c, &seq, toks(prompt), span(0, len(prompt)), pick)
		if err != nil {
			t.Fatal(err)
		}
		if rows[len(rows)-1] != len(prompt)-1 || len(rows) >= len(prompt) {
			t.Fatalf("trial %d: rows %v", trial, rows)
		}
		if equalBits(lg[(len(rows)-1)*V:], wantLast) >= 0 {
			t.Fatalf("trial %d: last logits differ with exact reused K/V", trial)
		}
		for i, r := range rows { // every kept token's logits too
			if equalBits(lg[i*V:(i+1)*V], full[r*V:(r+1)*V]) >= 0 {
				t.Fatalf("trial %d: row %d logits differ", trial, r)
			}
		}
	}
	zero := newCache(t, m, 16, 16)
	var zs Sequence
	if err := zs.Reserve(zero, len(prompt)); err != nil {
		t.Fatal(err)
	}
	zs.Len = len(prompt)
	lg, _, err := m.ForwardRecompute(zero, &zs, toks(prompt), span(0, len(prompt)), func(int, []int, []float32, []float32) ([]int, error) {
		return []int{len(prompt) - 1}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if equalBits(lg, wantLast) < 0 {
		t.Fatal("last logits equal with a zeroed cache: the reuse check cannot fail")
	}
}

// TestForwardRecomputeBadPick: a pick returning nothing, rows not computed, or rows out of
// order is ErrInvalid naming the layer, never a panic; bad steps are refused as Forward's.
func TestForwardRecomputeBadPick(t *testing.T) {
	m := trained(t)
	c := newCache(t, m, 4, 16)
	var seq Sequence
	if err := seq.Reserve(c, 40); err != nil {
		t.Fatal(err)
	}
	tk := toks([]byte("func main() { fmt.Println(\"hello\") }\n//"))
	for name, bad := range map[string]func([]int) []int{
		"empty":      func([]int) []int { return nil },
		"unknown":    func(r []int) []int { return []int{len(r) + 5} },
		"negative":   func([]int) []int { return []int{-1} },
		"descending": func(r []int) []int { return []int{r[2], r[1]} },
		"duplicate":  func(r []int) []int { return []int{r[1], r[1]} },
	} {
		seq.Len = 0
		_, _, err := m.ForwardRecompute(c, &seq, tk, span(0, len(tk)), func(_ int, rows []int, _, _ []float32) ([]int, error) {
			return bad(rows), nil
		})
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A pick dropping rows in layer 0 then returning a dropped one in layer 1.
	_, _, err := m.ForwardRecompute(c, &seq, tk, span(0, len(tk)), func(layer int, rows []int, _, _ []float32) ([]int, error) {
		if layer == 0 {
			return rows[len(rows)-1:], nil
		}
		return []int{0}, nil
	})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("row dropped earlier: %v", err)
	}
	wantErr := errors.New("pick failed")
	if _, _, err := m.ForwardRecompute(c, &seq, tk, span(0, len(tk)), func(int, []int, []float32, []float32) ([]int, error) {
		return nil, wantErr
	}); !errors.Is(err, wantErr) {
		t.Errorf("pick error: %v", err)
	}
	if _, _, err := m.ForwardRecompute(c, &seq, tk, span(3, len(tk)), nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("positions after seq.Len: %v", err)
	}
	if _, _, err := m.ForwardRecompute(c, &seq, slices.Repeat([]int{300}, 2), span(0, 2), nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("token out of vocabulary: %v", err)
	}
}
