package kernels

import (
	"encoding/binary"
	"math"
	"math/bits"
	"math/rand/v2"

	"github.com/ucm-go/ucm/internal/crc32c"
	"github.com/ucm-go/ucm/internal/reuse"
)

// GSA On-Device hash codes (docs/sparse-sources.md §4): sign bits of a random orthonormal
// projection, compared by Hamming distance.

// MaxHashDim is the largest input dimension of a HashEncoder (its QR costs O(dim³) at creation:
// about a second at this size; MLA's kv_lora_rank is 512).
const MaxHashDim = 1024

// hashStream is the PCG stream (second seed word) of every HashEncoder's generator.
const hashStream = 0x9e3779b97f4a7c15

// A HashEncoder maps vectors of InputDim elements to HashBits sign bits of a seeded
// Haar-orthonormal projection W [InputDim][HashBits]. W is a deterministic function of
// (InputDim, HashBits, seed), computed as follows, so any implementation can reproduce it:
//
//  1. G [InputDim][HashBits], filled row by row with N(0, 2²) draws (standard deviation 2, as
//     torch.normal(0, 2); the scale does not change W): a PCG-DXSM generator
//     (math/rand/v2.NewPCG(seed, 0x9e3779b97f4a7c15)) gives uint64s; u = 2·(x>>11)·2⁻⁵³ − 1 in
//     [−1, 1), taken in pairs (u, v) by Marsaglia's polar method (reject s = u²+v² ≥ 1 or 0;
//     emit u·f then v·f, f = √(−2·ln s / s)), each times 2.
//  2. (Q, R) = QR(G) by Householder reflections in float64; W = Q·diag(sign(diag(R))), the
//     unique QR factor with a positive diagonal, rounded to float32.
//
// Fingerprint identifies W's float32 values, so a reader can tell whether stored codes came
// from the W it has. A HashEncoder is immutable and safe for concurrent use.
type HashEncoder struct {
	inputDim, hashBits int
	seed               uint64
	wt                 []float32 // Wᵀ: [hashBits][inputDim], row j is column j of W
	w                  []float32 // W: [inputDim][hashBits], for the SIMD kernel (hash_amd64.s)
	fp                 uint32
}

// NewHashEncoder builds the encoder for (inputDim, hashBits, seed). hashBits must be a positive
// multiple of 8 and at most inputDim; inputDim at most MaxHashDim. Otherwise ErrInvalid.
func NewHashEncoder(inputDim, hashBits int, seed uint64) (*HashEncoder, error) {
	switch {
	case inputDim < 1 || inputDim > MaxHashDim:
		return nil, errorf(ErrInvalid, "hash encoder: input dim %d not in [1, %d]", inputDim, MaxHashDim)
	case hashBits < 8 || hashBits%8 != 0:
		return nil, errorf(ErrInvalid, "hash encoder: hash bits %d not a positive multiple of 8", hashBits)
	case hashBits > inputDim:
		return nil, errorf(ErrInvalid, "hash encoder: hash bits %d over input dim %d", hashBits, inputDim)
	}
	n, m := inputDim, hashBits
	q, diag := householderQR(hashGaussian(n, m, seed), n, m)
	e := &HashEncoder{inputDim: n, hashBits: m, seed: seed, wt: make([]float32, m*n)}
	for j := range m {
		if diag[j] == 0 || math.IsNaN(diag[j]) {
			return nil, errorf(ErrInvalid, "hash encoder: seed %d gives a rank-deficient projection", seed)
		}
		sign := 1.0
		if diag[j] < 0 {
			sign = -1
		}
		for i := range n {
			e.wt[j*n+i] = float32(sign * q[i*m+j])
		}
	}
	e.w = e.Weights()
	var buf [4]byte
	var crc uint32
	for _, w := range e.wt {
		binary.LittleEndian.PutUint32(buf[:], math.Float32bits(w))
		crc = crc32c.Update(crc, buf[:])
	}
	e.fp = crc
	return e, nil
}

// hashGaussian is G of step 1 of the HashEncoder recipe: row-major [n][m] draws of N(0, 2²).
func hashGaussian(n, m int, seed uint64) []float64 {
	g := make([]float64, n*m)
	rng := rand.NewPCG(seed, hashStream)
	uniform := func() float64 { return 2*float64(rng.Uint64()>>11)*0x1p-53 - 1 }
	for i := 0; i < len(g); {
		u, v := uniform(), uniform()
		s := u*u + v*v
		if s >= 1 || s == 0 {
			continue
		}
		f := math.Sqrt(-2 * math.Log(s) / s)
		g[i] = 2 * u * f
		i++
		if i < len(g) {
			g[i] = 2 * v * f
			i++
		}
	}
	return g
}

// householderQR factors the row-major [n][m] matrix a (n ≥ m; overwritten) as Q·R and returns
// the reduced Q ([n][m], orthonormal columns) and R's diagonal.
func householderQR(a []float64, n, m int) (q, diag []float64) {
	vs := make([][]float64, m) // reflector k acts on rows k…n−1
	diag = make([]float64, m)
	for k := range m {
		var ss float64
		for i := k; i < n; i++ {
			ss += a[i*m+k] * a[i*m+k]
		}
		norm := math.Sqrt(ss)
		alpha := -norm
		if a[k*m+k] < 0 {
			alpha = norm
		}
		v := make([]float64, n-k)
		for i := k; i < n; i++ {
			v[i-k] = a[i*m+k]
		}
		v[0] -= alpha
		var vv float64
		for _, x := range v {
			vv += x * x
		}
		diag[k] = alpha
		if vv == 0 { // the column is already zero below the diagonal and alpha is 0
			continue
		}
		vs[k] = v
		// A[k:, k:] -= 2 v (vᵀ A[k:, k:]) / vᵀv
		for j := k; j < m; j++ {
			var s float64
			for i := k; i < n; i++ {
				s += v[i-k] * a[i*m+j]
			}
			s *= 2 / vv
			for i := k; i < n; i++ {
				a[i*m+j] -= s * v[i-k]
			}
		}
	}
	// Q = H_0 H_1 … H_{m−1} applied to the first m columns of the identity.
	q = make([]float64, n*m)
	for j := range m {
		q[j*m+j] = 1
	}
	for k := m - 1; k >= 0; k-- {
		v := vs[k]
		if v == nil {
			continue
		}
		var vv float64
		for _, x := range v {
			vv += x * x
		}
		for j := range m {
			var s float64
			for i := k; i < n; i++ {
				s += v[i-k] * q[i*m+j]
			}
			if s == 0 {
				continue
			}
			s *= 2 / vv
			for i := k; i < n; i++ {
				q[i*m+j] -= s * v[i-k]
			}
		}
	}
	return q, diag
}

// InputDim is the length of the vectors the encoder hashes.
func (e *HashEncoder) InputDim() int { return e.inputDim }

// HashBits is the bits of one code.
func (e *HashEncoder) HashBits() int { return e.hashBits }

// CodeBytes is the bytes of one packed code, HashBits/8.
func (e *HashEncoder) CodeBytes() int { return e.hashBits / 8 }

// Seed is the seed W was generated from.
func (e *HashEncoder) Seed() uint64 { return e.seed }

// Fingerprint is the CRC-32C (Castagnoli) of W's float32 values (little-endian bits) taken
// column by column: equal fingerprints mean equal projections.
func (e *HashEncoder) Fingerprint() uint32 { return e.fp }

// Weights returns a copy of W, row-major [InputDim][HashBits].
func (e *HashEncoder) Weights() []float32 {
	w := make([]float32, len(e.wt))
	for j := range e.hashBits {
		for i := range e.inputDim {
			w[i*e.hashBits+j] = e.wt[j*e.inputDim+i]
		}
	}
	return w
}

// Project writes p = x·W (HashBits values, float32 accumulation in index order) to dst. x must
// have InputDim elements and dst HashBits; otherwise ErrInvalid.
func (e *HashEncoder) Project(dst, x []float32) error {
	if len(x) != e.inputDim || len(dst) != e.hashBits {
		return errorf(ErrInvalid, "hash projection: x has %d elements (want %d), dst %d (want %d)", len(x), e.inputDim, len(dst), e.hashBits)
	}
	for j := 0; j < e.hashBits; j += 4 {
		dst[j], dst[j+1], dst[j+2], dst[j+3] = e.dot4(x, j)
	}
	return nil
}

// dot4 is the projections j … j+3 of x (len(x) == inputDim, j+3 < hashBits), each accumulated
// in float32 in index order. (Eight projections per pass, or two partial sums per projection,
// measured slower: register spills and bounds checks.)
func (e *HashEncoder) dot4(x []float32, j int) (s0, s1, s2, s3 float32) {
	n := e.inputDim
	w0 := e.wt[j*n : (j+1)*n]
	w1 := e.wt[(j+1)*n : (j+2)*n]
	w2 := e.wt[(j+2)*n : (j+3)*n]
	w3 := e.wt[(j+3)*n : (j+4)*n]
	x = x[:n]
	for i, v := range x {
		s0 += v * w0[i]
		s1 += v * w1[i]
		s2 += v * w2[i]
		s3 += v * w3[i]
	}
	return
}

// Hash writes the code of x to dst (CodeBytes bytes): bit j, stored LSB first (bit j in byte
// j/8 at position j%8), is 1 iff the projection (x·W)_j computed as Project does is > 0. x must
// have InputDim elements; otherwise ErrInvalid.
func (e *HashEncoder) Hash(dst []byte, x []float32) error {
	if len(x) != e.inputDim || len(dst) != e.hashBits/8 {
		return errorf(ErrInvalid, "hash: x has %d elements (want %d), dst %d bytes (want %d)", len(x), e.inputDim, len(dst), e.hashBits/8)
	}
	e.hash(dst, x)
	return nil
}

func (e *HashEncoder) hash(dst []byte, x []float32) {
	// With AVX2, 32 projections per pass over x, lane-parallel across projections: each one's
	// sum is the same sequence of float32 multiplies and adds as below, so the bits are equal.
	// The portable loop takes the rest: four projections per pass (more accumulators spill
	// registers and run slower in Go).
	e.hashBytes(dst, x, e.hashSigns(dst, x))
}

// hashBytes is the portable hash of code bytes from … len(dst)−1.
func (e *HashEncoder) hashBytes(dst []byte, x []float32, from int) {
	for b := from; b < len(dst); b++ {
		var code byte
		for k := 0; k < 8; k += 4 {
			p0, p1, p2, p3 := e.dot4(x, 8*b+k)
			code |= b2u(p0 > 0)<<k | b2u(p1 > 0)<<(k+1) | b2u(p2 > 0)<<(k+2) | b2u(p3 > 0)<<(k+3)
		}
		dst[b] = code
	}
}

func b2u(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// HashCodeBytes is the bytes of one vector's code under encs: the sum of their CodeBytes.
func HashCodeBytes(encs ...*HashEncoder) int {
	n := 0
	for _, e := range encs {
		if e != nil {
			n += e.CodeBytes()
		}
	}
	return n
}

// HashBlock computes the key hash codes of one layer of one block: dst is [tokens][heads][c],
// c = HashCodeBytes(encs...). Each token's head vector (dim elements) is split into
// consecutive pieces of encs[0].InputDim(), encs[1].InputDim(), …, which must sum to dim; each
// piece is hashed by its encoder and the codes are concatenated in encoder order. GQA models
// use one encoder; MLA uses two (kv_lora_rank, then qk_rope_head_dim) on its single head.
func HashBlock(dst []byte, k []byte, dt DType, s KShape, encs ...*HashEncoder) error {
	const what = "hash block"
	if err := checkK(what, k, dt, s); err != nil {
		return err
	}
	if len(encs) == 0 {
		return errorf(ErrInvalid, "%s: no hash encoder", what)
	}
	dim := 0
	for i, e := range encs {
		if e == nil {
			return errorf(ErrInvalid, "%s: hash encoder %d is nil", what, i)
		}
		dim += e.inputDim
	}
	if dim != s.Dim {
		return errorf(ErrInvalid, "%s: hash encoders take %d elements, head dim is %d", what, dim, s.Dim)
	}
	c := HashCodeBytes(encs...)
	if len(dst) != s.Tokens*s.Heads*c {
		return errorf(ErrInvalid, "%s: dst is %d bytes, want [%d][%d][%d] = %d", what, len(dst), s.Tokens, s.Heads, c, s.Tokens*s.Heads*c)
	}
	n := s.Heads * s.Dim
	sc := getScratch()
	defer putScratch(sc)
	sc.row = reuse.Grow(sc.row, n)
	row := sc.row
	stride := n * dt.Size()
	out := 0
	for t := range s.Tokens {
		decodeRow(row, k[t*stride:(t+1)*stride], dt)
		for h := range s.Heads {
			x := row[h*s.Dim : (h+1)*s.Dim]
			for _, e := range encs {
				e.hash(dst[out:out+e.CodeBytes()], x[:e.inputDim])
				x = x[e.inputDim:]
				out += e.CodeBytes()
			}
		}
	}
	return nil
}

// Hamming is the number of differing bits of the packed codes a and b, Σ popcount(a XOR b). A
// shorter code counts as zero-padded to the longer one's length.
func Hamming(a, b []byte) int {
	if len(a) > len(b) {
		a, b = b, a
	}
	d := 0
	i := 0
	for ; i+8 <= len(a); i += 8 {
		d += bits.OnesCount64(binary.LittleEndian.Uint64(a[i:]) ^ binary.LittleEndian.Uint64(b[i:]))
	}
	for ; i < len(a); i++ {
		d += bits.OnesCount8(a[i] ^ b[i])
	}
	for ; i < len(b); i++ {
		d += bits.OnesCount8(b[i])
	}
	return d
}
