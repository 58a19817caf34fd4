package sparse

import (
	"fmt"
	"math"
	"sync"

	"github.com/ucm-go/ucm/internal/par"
	"github.com/ucm-go/ucm/kernels"
)

// Retrieval over a caller's representation matrix: the computation of UCM's CPU retrieval
// modules (ESA's retrieval_backend), without a store or a method's hooks. The caller keeps
// the rows; a call reads them in place.

// MaxRetrieveElems bounds every length a retrieval takes (rows × dim, batch × width, batch ×
// k): 2^31 elements, as the C ABI's sizes.
const MaxRetrieveElems = 1 << 31

// DotArgs is one ESA retrieval: for each of the Batch = len(Q)/Dim query rows, the K rows of
// Data (rows of Dim float32) among that row's candidates with the largest dot product with it.
type DotArgs struct {
	Q    []float32 // Batch × Dim query rows
	Data []float32 // the representation rows, Dim each (read in place, never written)
	Dim  int
	// Cand holds Batch rows of Width candidate row numbers of Data; -1 is no candidate (a
	// padding entry). nil: every row of Data is a candidate of every query row (Width is then
	// ignored).
	Cand  []int32
	Width int
	K     int
	// The results: Batch rows of K entries each. Row b's first Count[b] = min(K, its
	// candidates) entries are candidate row numbers and their scores, score descending, ties to
	// the earlier candidate in the row, NaN after every number; the rest are -1 and -Inf.
	// Count may be nil.
	Idx    []int32
	Scores []float32
	Count  []int64
}

// Batch is the number of query rows (0 when Dim is not positive).
func (a *DotArgs) Batch() int {
	if a.Dim <= 0 {
		return 0
	}
	return len(a.Q) / a.Dim
}

// Check validates a's shapes and candidates: every error wraps ErrInvalid and names the field,
// or the row and column of a candidate outside [-1, rows of Data).
func (a *DotArgs) Check() error {
	if a.Dim <= 0 || a.Dim > MaxRetrieveElems {
		return fmt.Errorf("dot retrieval: dim %d: want 1 … %d: %w", a.Dim, MaxRetrieveElems, ErrInvalid)
	}
	if len(a.Q)%a.Dim != 0 || len(a.Data)%a.Dim != 0 {
		return fmt.Errorf("dot retrieval: q of %d and data of %d values: not whole rows of dim %d: %w", len(a.Q), len(a.Data), a.Dim, ErrInvalid)
	}
	if len(a.Data) > MaxRetrieveElems {
		return fmt.Errorf("dot retrieval: data of %d values: more than %d: %w", len(a.Data), MaxRetrieveElems, ErrInvalid)
	}
	b, rows := a.Batch(), len(a.Data)/a.Dim
	if a.K < 0 || int64(a.K)*int64(b) > MaxRetrieveElems {
		return fmt.Errorf("dot retrieval: topk %d for %d rows: %w", a.K, b, ErrInvalid)
	}
	if len(a.Idx) < b*a.K || len(a.Scores) < b*a.K {
		return fmt.Errorf("dot retrieval: outputs of %d indices and %d scores for %d rows of topk %d: %w", len(a.Idx), len(a.Scores), b, a.K, ErrInvalid)
	}
	if a.Count != nil && len(a.Count) < b {
		return fmt.Errorf("dot retrieval: count of %d for %d rows: %w", len(a.Count), b, ErrInvalid)
	}
	if a.Cand == nil {
		return nil
	}
	if a.Width < 0 || int64(a.Width)*int64(b) != int64(len(a.Cand)) {
		return fmt.Errorf("dot retrieval: %d candidates: not %d rows of width %d: %w", len(a.Cand), b, a.Width, ErrInvalid)
	}
	for i, c := range a.Cand {
		if c < -1 || int(c) >= rows {
			return fmt.Errorf("dot retrieval: candidate %d (row %d, column %d): outside [-1, %d): %w", c, i/a.Width, i%a.Width, rows, ErrInvalid)
		}
	}
	return nil
}

// scoreScratch holds a retrieval's candidate scores (Batch × Width); rowScratch one row's
// top-k working memory. Both are pooled across calls.
type (
	scoreScratch struct{ scores []float32 }
	rowScratch   struct {
		row  []float32 // the row's valid candidates' scores
		cols []int32   // their columns
		keys []uint64
		pos  []int32
		sc   []float32
	}
)

var (
	scoreScratchPool = sync.Pool{New: func() any { return new(scoreScratch) }}
	rowScratchPool   = sync.Pool{New: func() any { return new(rowScratch) }}
)

// dotGrain is the candidates a worker scores per claim: 1,024 rows of 1,024 floats are 4 MiB,
// enough to amortise a claim, few enough to balance two workers on a busy machine.
const dotGrain = 1024

// DotTopK runs the retrieval a describes on the calling goroutine and up to workers-1 helpers
// (internal/par: the candidates of all rows in chunks, then the rows' top-k). It checks a
// first (DotArgs.Check) and writes nothing when that fails. Scores are float32 sums in the
// order kernels.DotsF32 takes: they differ from a float64 sum by rounding only.
func DotTopK(a *DotArgs, workers int) error {
	if err := a.Check(); err != nil {
		return err
	}
	b, d := a.Batch(), a.Dim
	if b == 0 {
		return nil
	}
	rows := len(a.Data) / d
	width := a.Width
	if a.Cand == nil {
		width = rows
	}
	s := scoreScratchPool.Get().(*scoreScratch)
	defer scoreScratchPool.Put(s)
	s.scores = resize(s.scores, b*width)
	cand := func(i int) int32 {
		if a.Cand == nil {
			return int32(i % width)
		}
		return a.Cand[i]
	}
	par.Chunks(b*width, dotGrain, workers, func(lo, hi int) {
		for i := lo; i < hi; {
			c := cand(i)
			if c < 0 {
				i++
				continue
			}
			// A run of consecutive rows of Data within one query row: one kernel call.
			e := i + 1
			for e < hi && e%width != 0 && cand(e) == c+int32(e-i) {
				e++
			}
			qr := i / width
			_ = kernels.DotsF32(s.scores[i:e], a.Q[qr*d:(qr+1)*d], a.Data[int(c)*d:(int(c)+e-i)*d], d, 0, d)
			i = e
		}
	})
	// The rows' top-k, one row per claim.
	par.Chunks(b, 1, workers, func(lo, hi int) {
		rs := rowScratchPool.Get().(*rowScratch)
		defer rowScratchPool.Put(rs)
		for r := lo; r < hi; r++ {
			rs.row, rs.cols = rs.row[:0], rs.cols[:0]
			for j := range width {
				if cand(r*width+j) >= 0 {
					rs.row = append(rs.row, s.scores[r*width+j])
					rs.cols = append(rs.cols, int32(j))
				}
			}
			rs.pos = resize(rs.pos, min(a.K, len(rs.row)))
			rs.sc = resize(rs.sc, len(rs.pos))
			n := topKDesc(rs.pos, rs.sc, rs.row, a.K, &rs.keys)
			idx, sc := a.Idx[r*a.K:(r+1)*a.K], a.Scores[r*a.K:(r+1)*a.K]
			for i := range n {
				idx[i], sc[i] = cand(r*width+int(rs.cols[rs.pos[i]])), rs.sc[i]
			}
			for i := n; i < a.K; i++ {
				idx[i], sc[i] = -1, float32(math.Inf(-1))
			}
			if a.Count != nil {
				a.Count[r] = int64(n)
			}
		}
	})
	return nil
}
