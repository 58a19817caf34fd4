package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/ucm-go/ucm/kernels"
)

// tinyConfig is a model small enough for fuzzing and corruption tests.
var tinyConfig = Config{Vocab: 256, DModel: 16, Layers: 1, Heads: 2, KVHeads: 1, HeadDim: 8,
	FFNDim: 24, MaxCtx: 64, RopeTheta: 10000, NormEps: 1e-5}

// encodeWeights writes a weights file as train.py does, with deterministic small weights.
func encodeWeights(cfg Config) []byte {
	w := &Model{cfg: cfg, layers: make([]layer, cfg.Layers)}
	specs := w.specs()
	le := binary.LittleEndian
	var table []byte
	sizes := make([]int, len(specs))
	for i, s := range specs {
		n := 1
		for _, d := range s.shape {
			n *= d
		}
		sizes[i] = 2 * n
	}
	entry := func(s tensorSpec, off, nbytes int) []byte {
		e := le.AppendUint16(nil, uint16(len(s.name)))
		e = append(e, s.name...)
		e = append(e, dtypeF16, byte(len(s.shape)))
		for _, d := range s.shape {
			e = le.AppendUint32(e, uint32(d))
		}
		e = le.AppendUint64(e, uint64(off))
		return le.AppendUint64(e, uint64(nbytes))
	}
	for i, s := range specs {
		table = append(table, entry(s, 0, sizes[i])...)
	}
	off := headerBytes + len(table)
	offs := make([]int, len(specs))
	for i := range specs {
		off = (off + dataAlign - 1) / dataAlign * dataAlign
		offs[i] = off
		off += sizes[i]
	}
	table = table[:0]
	for i, s := range specs {
		table = append(table, entry(s, offs[i], sizes[i])...)
	}
	b := []byte(Magic)
	b = le.AppendUint32(b, Version)
	for _, v := range []int{cfg.Vocab, cfg.DModel, cfg.Layers, cfg.Heads, cfg.KVHeads, cfg.HeadDim, cfg.FFNDim, cfg.MaxCtx} {
		b = le.AppendUint32(b, uint32(v))
	}
	b = le.AppendUint32(b, math.Float32bits(cfg.RopeTheta))
	b = le.AppendUint32(b, math.Float32bits(cfg.NormEps))
	flags := uint32(0)
	if cfg.TiedEmbeddings {
		flags = flagTied
	}
	b = le.AppendUint32(b, flags)
	b = le.AppendUint32(b, uint32(len(specs)))
	b = le.AppendUint32(b, uint32(len(table)))
	b = append(b, table...)
	for i, s := range specs {
		b = append(b, make([]byte, offs[i]-len(b))...)
		for j := range sizes[i] / 2 {
			v := float32(math.Sin(float64(j*7+len(s.name)))) * 0.2
			if len(s.shape) == 1 {
				v = 1 // norms
			}
			b = le.AppendUint16(b, kernels.Float32ToFloat16(v))
		}
	}
	return b
}

func TestTinyModelRoundTrip(t *testing.T) {
	for _, tied := range []bool{false, true} {
		cfg := tinyConfig
		cfg.TiedEmbeddings = tied
		m, err := Parse(encodeWeights(cfg))
		if err != nil {
			t.Fatalf("tied=%v: %v", tied, err)
		}
		if m.Config() != cfg {
			t.Fatalf("config %+v, want %+v", m.Config(), cfg)
		}
		c, err := NewKVCache(cfg, 4, 4)
		if err != nil {
			t.Fatal(err)
		}
		var seq Sequence
		out, err := m.Generate(c, &seq, []byte("package main"), 3)
		if err != nil || len(out) != 3 {
			t.Fatalf("Generate: %q, %v", out, err)
		}
	}
}

// TestCorruptWeights damages a valid file field by field: every damage is a *FormatError
// naming the field or tensor, wrapping ErrCorrupt.
func TestCorruptWeights(t *testing.T) {
	good := encodeWeights(tinyConfig)
	le := binary.LittleEndian
	// Offsets in the table of the first entry (tok_embeddings).
	const e0 = headerBytes
	nameLen := len("tok_embeddings")
	dtypeAt := e0 + 2 + nameLen
	dimsAt := dtypeAt + 2
	offAt := dimsAt + 8
	nbytesAt := offAt + 8
	dataAt := int(le.Uint64(good[offAt:]))
	for _, tc := range []struct {
		name, field string
		damage      func(b []byte) []byte
	}{
		{"magic", "magic", func(b []byte) []byte { b[0] = 'X'; return b }},
		{"version", "version", func(b []byte) []byte { le.PutUint32(b[8:], 2); return b }},
		{"vocab zero", "vocab", func(b []byte) []byte { le.PutUint32(b[12:], 0); return b }},
		{"d_model huge", "d_model", func(b []byte) []byte { le.PutUint32(b[16:], 1<<31); return b }},
		{"layers huge", "n_layers", func(b []byte) []byte { le.PutUint32(b[20:], 1<<30); return b }},
		{"kv heads not dividing", "n_kv_heads", func(b []byte) []byte { le.PutUint32(b[28:], 3); return b }},
		{"odd head_dim", "head_dim", func(b []byte) []byte { le.PutUint32(b[32:], 7); return b }},
		{"theta NaN", "rope_theta", func(b []byte) []byte { le.PutUint32(b[44:], 0x7fc00000); return b }},
		{"eps negative", "norm_eps", func(b []byte) []byte { le.PutUint32(b[48:], math.Float32bits(-1)); return b }},
		{"unknown flag", "flags", func(b []byte) []byte { le.PutUint32(b[52:], 6); return b }},
		{"tensor count", "n_tensors", func(b []byte) []byte { le.PutUint32(b[56:], 3); return b }},
		{"table past the end", "table_bytes", func(b []byte) []byte { le.PutUint32(b[60:], 1<<30); return b }},
		{"table with slack", "table_bytes", func(b []byte) []byte { le.PutUint32(b[60:], le.Uint32(b[60:])+1); return b }},
		{"name", "tok_embeddings", func(b []byte) []byte { b[e0+2] = 'X'; return b }},
		{"name length", "tok_embeddings", func(b []byte) []byte { le.PutUint16(b[e0:], 0xffff); return b }},
		{"dtype", "tok_embeddings: dtype", func(b []byte) []byte { b[dtypeAt] = 5; return b }},
		{"ndim", "tok_embeddings: ndim", func(b []byte) []byte { b[dtypeAt+1] = 9; return b }},
		{"ndim wrong", "tok_embeddings: shape", func(b []byte) []byte { b[dtypeAt+1] = 1; return b }},
		{"shape", "tok_embeddings: shape", func(b []byte) []byte { le.PutUint32(b[dimsAt:], 255); return b }},
		{"offset misaligned", "tok_embeddings: offset", func(b []byte) []byte { le.PutUint64(b[offAt:], uint64(dataAt+2)); return b }},
		{"offset past the end", "tok_embeddings: offset", func(b []byte) []byte { le.PutUint64(b[offAt:], 1<<62); return b }},
		{"offset in the table", "tok_embeddings: offset", func(b []byte) []byte { le.PutUint64(b[offAt:], 64); return b }},
		{"nbytes", "tok_embeddings: nbytes", func(b []byte) []byte { le.PutUint64(b[nbytesAt:], 1<<63); return b }},
		{"NaN weight", "tok_embeddings", func(b []byte) []byte { le.PutUint16(b[dataAt+6:], 0x7e00); return b }},
		{"Inf weight", "tok_embeddings", func(b []byte) []byte { le.PutUint16(b[dataAt:], 0x7c00); return b }},
		{"truncated data", "output: offset", func(b []byte) []byte { return b[:len(b)-1] }},
		{"truncated header", "header", func(b []byte) []byte { return b[:40] }},
	} {
		b := tc.damage(append([]byte(nil), good...))
		_, err := Parse(b)
		var fe *FormatError
		if !errors.Is(err, ErrCorrupt) || !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want a FormatError for %q", tc.name, err, tc.field)
		}
	}
	for n := 0; n < len(good); n += 1 + n/1024*97 { // every length through the table, then a sample
		if _, err := Parse(good[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
}

func TestLoadDirChecksum(t *testing.T) {
	dir := t.TempDir()
	b := encodeWeights(tinyConfig)
	sum := sha256.Sum256(b)
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(WeightsFile, b)
	write(ManifestFile, fmt.Appendf(nil, `{"weights_file": %q, "weights_sha256": %q}`, WeightsFile, hex.EncodeToString(sum[:])))
	if _, _, err := LoadDir(dir); err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1
	write(WeightsFile, b)
	if _, _, err := LoadDir(dir); !errors.Is(err, ErrChecksum) {
		t.Fatalf("flipped bit: %v, want ErrChecksum", err)
	}
	for _, manifest := range []string{`{`, `{"weights_file": "model.ucmw", "weights_sha256": "abc"}`,
		`{"weights_file": "../x", "weights_sha256": "` + hex.EncodeToString(sum[:]) + `"}`} {
		write(ManifestFile, []byte(manifest))
		if _, _, err := LoadDir(dir); !errors.Is(err, ErrCorrupt) {
			t.Errorf("manifest %s: %v, want ErrCorrupt", manifest, err)
		}
	}
}

// TestCommittedManifest checks the committed weights against their manifest and reports the
// held-out loss recorded there.
func TestCommittedManifest(t *testing.T) {
	m := trained(t)
	man, err := ReadManifest(filepath.Join("weights", ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join("weights", man.WeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > 20<<20 {
		t.Errorf("weights are %d bytes, over 20 MiB", st.Size())
	}
	if m.Config().Vocab != 256 {
		t.Errorf("vocab %d, want the byte-level 256", m.Config().Vocab)
	}
	t.Logf("config %+v; held-out %.4f nats/byte (%.4f bits/byte)", m.Config(), man.Heldout.LossNatsPerByte, man.Heldout.LossBitsPerByte)
}

// FuzzLoadWeights: Parse never panics; it either fails with ErrCorrupt or returns a model that
// runs a forward step.
func FuzzLoadWeights(f *testing.F) {
	good := encodeWeights(tinyConfig)
	f.Add(good)
	tied := tinyConfig
	tied.TiedEmbeddings = true
	f.Add(encodeWeights(tied))
	f.Add(good[:100])
	f.Add([]byte(Magic))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not ErrCorrupt: %v", err)
			}
			return
		}
		c, err := NewKVCache(m.Config(), 1, 2)
		if err != nil {
			t.Fatal(err)
		}
		seq := Sequence{Blocks: []int{0}}
		if _, err := m.Forward(c, &seq, []int{0, m.Config().Vocab - 1}, []int{0, 1}); err != nil {
			t.Fatal(err)
		}
	})
}
