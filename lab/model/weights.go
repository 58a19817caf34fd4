package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/ucm-go/ucm/kernels"
)

// The weights file (docs/model.md has the byte diagram). All integers little-endian.
const (
	// Magic opens every weights file.
	Magic = "UCMMODEL"
	// Version is the only weights file version this package reads.
	Version = 1
	// WeightsFile and ManifestFile are the names train.py gives its outputs in weights/.
	WeightsFile  = "model.ucmw"
	ManifestFile = "MANIFEST.json"

	headerBytes = 64
	dataAlign   = 64
	dtypeF16    = 1
	flagTied    = 1

	// Bounds on the header's fields, far above any model this package is meant for; they keep
	// every size computed from a corrupt header small enough not to overflow or to allocate
	// without limit (the tensors must in any case fit in the file).
	maxVocab    = 1 << 20
	maxDModel   = 1 << 14
	maxLayers   = 1 << 10
	maxHeads    = 1 << 10
	maxHeadDim  = 1 << 10
	maxFFN      = 1 << 16
	maxCtx      = 1 << 24
	maxNameLen  = 256
	maxDims     = 4
	maxFileSize = 1 << 31
)

// Config is a model's shape, as stored in the weights file's header.
type Config struct {
	// Vocab is the vocabulary size: 256 for the byte-level model (token = byte value).
	Vocab int
	// DModel is the residual stream's width.
	DModel int
	// Layers is the number of decoder blocks.
	Layers int
	// Heads and KVHeads are the query and key/value heads (grouped-query attention: query head
	// h reads KV head h / (Heads/KVHeads)).
	Heads   int
	KVHeads int
	// HeadDim is the elements per head (even: RoPE rotates halves).
	HeadDim int
	// FFNDim is the SwiGLU MLP's hidden width.
	FFNDim int
	// MaxCtx is the context the model was trained at; positions may go beyond it (RoPE has no
	// table limit) but quality is not known there.
	MaxCtx int
	// RopeTheta is RoPE's base (10000), NeoX half-split rotation as in HF Llama.
	RopeTheta float32
	// NormEps is RMSNorm's epsilon.
	NormEps float32
	// TiedEmbeddings is whether the LM head is the token embedding (no "output" tensor).
	TiedEmbeddings bool
}

// QDim is Heads × HeadDim, the width of the queries.
func (c Config) QDim() int { return c.Heads * c.HeadDim }

// KVDim is KVHeads × HeadDim, the width of one token's K (or V) in one layer.
func (c Config) KVDim() int { return c.KVHeads * c.HeadDim }

func (c Config) validate() error {
	check := func(name string, v, lo, hi int) error {
		if v < lo || v > hi {
			return corrupt(name, "%d not in [%d, %d]", v, lo, hi)
		}
		return nil
	}
	for _, f := range []struct {
		name      string
		v, lo, hi int
	}{
		{"vocab", c.Vocab, 1, maxVocab},
		{"d_model", c.DModel, 1, maxDModel},
		{"n_layers", c.Layers, 1, maxLayers},
		{"n_heads", c.Heads, 1, maxHeads},
		{"n_kv_heads", c.KVHeads, 1, maxHeads},
		{"head_dim", c.HeadDim, 2, maxHeadDim},
		{"ffn_dim", c.FFNDim, 1, maxFFN},
		{"max_ctx", c.MaxCtx, 1, maxCtx},
	} {
		if err := check(f.name, f.v, f.lo, f.hi); err != nil {
			return err
		}
	}
	if c.HeadDim%2 != 0 {
		return corrupt("head_dim", "%d is odd (RoPE rotates halves)", c.HeadDim)
	}
	if c.Heads%c.KVHeads != 0 {
		return corrupt("n_kv_heads", "%d does not divide n_heads %d", c.KVHeads, c.Heads)
	}
	if c.QDim() > maxDModel*4 {
		return corrupt("n_heads", "n_heads × head_dim = %d is too large", c.QDim())
	}
	th := float64(c.RopeTheta)
	if math.IsNaN(th) || th <= 1 || th > 1e9 {
		return corrupt("rope_theta", "%v not in (1, 1e9]", c.RopeTheta)
	}
	eps := float64(c.NormEps)
	if math.IsNaN(eps) || eps <= 0 || eps > 1 {
		return corrupt("norm_eps", "%v not in (0, 1]", c.NormEps)
	}
	return nil
}

// tensorSpec is one tensor the file must hold, in file order.
type tensorSpec struct {
	name  string
	shape []int
	dst   *[]float32
}

// layer is one decoder block's weights, float32, row-major [out][in] as torch's Linear.
type layer struct {
	attnNorm, wq, wk, wv, wo []float32
	ffnNorm, gate, up, down  []float32
}

// Model is a loaded model: its parameters, converted from fp16 to float32, and its forward pass.
// A Model is immutable and safe for concurrent use (each KVCache by one caller at a time).
type Model struct {
	cfg    Config
	embed  []float32 // [vocab][d_model]
	layers []layer
	norm   []float32 // [d_model]
	output []float32 // [vocab][d_model] (the embedding when tied)
}

func (w *Model) specs() []tensorSpec {
	c := w.cfg
	s := []tensorSpec{{"tok_embeddings", []int{c.Vocab, c.DModel}, &w.embed}}
	for i := range w.layers {
		l := &w.layers[i]
		p := fmt.Sprintf("layers.%d.", i)
		s = append(s,
			tensorSpec{p + "attention_norm", []int{c.DModel}, &l.attnNorm},
			tensorSpec{p + "wq", []int{c.QDim(), c.DModel}, &l.wq},
			tensorSpec{p + "wk", []int{c.KVDim(), c.DModel}, &l.wk},
			tensorSpec{p + "wv", []int{c.KVDim(), c.DModel}, &l.wv},
			tensorSpec{p + "wo", []int{c.DModel, c.QDim()}, &l.wo},
			tensorSpec{p + "ffn_norm", []int{c.DModel}, &l.ffnNorm},
			tensorSpec{p + "w_gate", []int{c.FFNDim, c.DModel}, &l.gate},
			tensorSpec{p + "w_up", []int{c.FFNDim, c.DModel}, &l.up},
			tensorSpec{p + "w_down", []int{c.DModel, c.FFNDim}, &l.down},
		)
	}
	s = append(s, tensorSpec{"norm", []int{c.DModel}, &w.norm})
	if !c.TiedEmbeddings {
		s = append(s, tensorSpec{"output", []int{c.Vocab, c.DModel}, &w.output})
	}
	return s
}

// Parse decodes a weights file held in memory. Every field and length is checked before
// anything is allocated from it; a file that is not a well-formed weights file returns a
// *FormatError (ErrCorrupt) naming the field or tensor at fault.
func Parse(b []byte) (*Model, error) {
	if len(b) > maxFileSize {
		return nil, corrupt("file", "%d bytes is too large", len(b))
	}
	if len(b) < headerBytes {
		return nil, corrupt("header", "file is %d bytes, shorter than the %d-byte header", len(b), headerBytes)
	}
	if string(b[:8]) != Magic {
		return nil, corrupt("magic", "%q is not %q", b[:8], Magic)
	}
	le := binary.LittleEndian
	if v := le.Uint32(b[8:]); v != Version {
		return nil, corrupt("version", "%d, this reader knows %d", v, Version)
	}
	u := func(off int) int { return int(le.Uint32(b[off:])) }
	cfg := Config{
		Vocab: u(12), DModel: u(16), Layers: u(20), Heads: u(24), KVHeads: u(28), HeadDim: u(32),
		FFNDim: u(36), MaxCtx: u(40),
		RopeTheta: math.Float32frombits(le.Uint32(b[44:])),
		NormEps:   math.Float32frombits(le.Uint32(b[48:])),
	}
	flags := le.Uint32(b[52:])
	if flags&^flagTied != 0 {
		return nil, corrupt("flags", "unknown bits %#x", flags&^flagTied)
	}
	cfg.TiedEmbeddings = flags&flagTied != 0
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	w := &Model{cfg: cfg, layers: make([]layer, cfg.Layers)}
	specs := w.specs()
	if n := u(56); n != len(specs) {
		return nil, corrupt("n_tensors", "%d, the config needs %d", n, len(specs))
	}
	tableLen := u(60)
	if tableLen > len(b)-headerBytes {
		return nil, corrupt("table_bytes", "%d runs past the end of the file (%d bytes)", tableLen, len(b))
	}
	table := b[headerBytes : headerBytes+tableLen]
	dataStart := headerBytes + tableLen
	prevEnd := dataStart
	for _, s := range specs {
		// name_len u16, name, dtype u8, ndim u8, dims u32×ndim, offset u64, nbytes u64
		if len(table) < 2 {
			return nil, corrupt(s.name, "tensor table ends before this entry")
		}
		nl := int(le.Uint16(table))
		table = table[2:]
		if nl == 0 || nl > maxNameLen || nl+2 > len(table) {
			return nil, corrupt(s.name, "entry's name length %d out of range or past the table", nl)
		}
		name := string(table[:nl])
		table = table[nl:]
		if name != s.name {
			return nil, corrupt(s.name, "table has %q where this tensor belongs", sanitize(name))
		}
		dt, nd := table[0], int(table[1])
		table = table[2:]
		if dt != dtypeF16 {
			return nil, corrupt(s.name+": dtype", "%d, want %d (float16)", dt, dtypeF16)
		}
		if nd < 1 || nd > maxDims || 4*nd+16 > len(table) {
			return nil, corrupt(s.name+": ndim", "%d out of range or past the table", nd)
		}
		if nd != len(s.shape) {
			return nil, corrupt(s.name+": shape", "%d dimensions, want %v", nd, s.shape)
		}
		for i := range nd {
			if d := int(le.Uint32(table[4*i:])); d != s.shape[i] {
				return nil, corrupt(s.name+": shape", "dimension %d is %d, want %v", i, d, s.shape)
			}
		}
		table = table[4*nd:]
		off, nbytes := le.Uint64(table), le.Uint64(table[8:])
		table = table[16:]
		numel := 1
		for _, d := range s.shape {
			numel *= d // bounded by validate: at most maxVocab·maxDModel or maxFFN·maxDModel
		}
		if nbytes != uint64(numel)*2 {
			return nil, corrupt(s.name+": nbytes", "%d, the shape needs %d", nbytes, numel*2)
		}
		if off%dataAlign != 0 {
			return nil, corrupt(s.name+": offset", "%d is not a multiple of %d", off, dataAlign)
		}
		if off < uint64(prevEnd) || off > uint64(len(b)) || nbytes > uint64(len(b))-off {
			return nil, corrupt(s.name+": offset", "[%d, +%d) overlaps the table or the previous tensor, or runs past the file's %d bytes", off, nbytes, len(b))
		}
		data := b[off : off+nbytes]
		prevEnd = int(off + nbytes)
		dst := make([]float32, numel)
		if err := kernels.DecodeFloat32(dst, data, kernels.Float16); err != nil {
			return nil, corrupt(s.name, "%v", err)
		}
		for i, v := range dst {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, corrupt(s.name, "element %d is %v", i, v)
			}
		}
		*s.dst = dst
	}
	if len(table) != 0 {
		return nil, corrupt("table_bytes", "%d bytes left after the last entry", len(table))
	}
	if cfg.TiedEmbeddings {
		w.output = w.embed
	}
	return w, nil
}

// sanitize keeps a name from a corrupt file printable and short.
func sanitize(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}

// Config returns the model's shape.
func (w *Model) Config() Config { return w.cfg }

// Manifest is the part of weights/MANIFEST.json (written by train.py) this package reads.
type Manifest struct {
	// WeightsFile is the weights file's name, in the manifest's directory.
	WeightsFile string `json:"weights_file"`
	// WeightsSHA256 is the weights file's sha256, 64 hex digits.
	WeightsSHA256 string `json:"weights_sha256"`
	// WeightsBytes is the weights file's size.
	WeightsBytes int64 `json:"weights_bytes"`
	// TrainingCommand is how the weights were made.
	TrainingCommand string `json:"training_command"`
	// Heldout is the held-out evaluation of the saved (fp16) weights.
	Heldout struct {
		// LossNatsPerByte and LossBitsPerByte are the mean next-byte cross-entropy.
		LossNatsPerByte float64 `json:"loss_nats_per_byte"`
		LossBitsPerByte float64 `json:"loss_bits_per_byte"`
	} `json:"heldout_eval"`
}

// ReadManifest reads and checks a manifest file (a sha256 of 64 hex digits and a plain file
// name are required; problems are ErrCorrupt).
func ReadManifest(path string) (*Manifest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, corrupt("manifest", "%v", err)
	}
	if d, err := hex.DecodeString(m.WeightsSHA256); err != nil || len(d) != sha256.Size {
		return nil, corrupt("manifest: weights_sha256", "%q is not a sha256", sanitize(m.WeightsSHA256))
	}
	if m.WeightsFile == "" || filepath.Base(m.WeightsFile) != m.WeightsFile {
		return nil, corrupt("manifest: weights_file", "%q is not a plain file name", sanitize(m.WeightsFile))
	}
	return &m, nil
}

// Load reads and parses a weights file without checking it against a manifest.
func Load(path string) (*Model, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Size() > maxFileSize {
		return nil, corrupt("file", "%s is %d bytes, too large", path, st.Size())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// LoadDir loads the weights a directory's MANIFEST.json names (train.py's output directory,
// weights/ beside this package), verifying the file's sha256 against the manifest first: a
// mismatch is ErrChecksum.
func LoadDir(dir string) (*Model, *Manifest, error) {
	m, err := ReadManifest(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, nil, err
	}
	path := filepath.Join(dir, m.WeightsFile)
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if st.Size() > maxFileSize {
		return nil, nil, corrupt("file", "%s is %d bytes, too large", path, st.Size())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != strings.ToLower(m.WeightsSHA256) {
		return nil, nil, fmt.Errorf("%w: %s has sha256 %s, the manifest says %s", ErrChecksum, path, got, m.WeightsSHA256)
	}
	w, err := Parse(b)
	if err != nil {
		return nil, nil, err
	}
	return w, m, nil
}
