package engine

import (
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ucm-go/ucm/wal"
)

// SchemaFile is the store's schema kept beside its index, in the store directory: the
// canonical text Schema.Canonical writes (whose SHA-256 is the fingerprint in every segment
// header), byte for byte:
//
//	ucm-schema/1
//	model="…"
//	dtype="…"
//	kv_layout="…"
//	tp_rank=N
//	tp_size=N
//	block_tokens=N
//	hash_scheme=ucmgo|ucm-pickle
//	extra="…"
//	shards=N
//	tensors_per_shard=N
//	shard_bytes=N
//
// It is written (atomically and durably, wal.ReplaceFile) whenever the store is opened for
// writing and the file is missing or differs. It lets a tool that adopts the stored schema
// open a store whose index lost its schema record (killed while the store was created, the
// index's WAL lost, an unreadable index set aside): the segments are then indexed again,
// checked against the fingerprint of this text. A file that does not parse back to exactly its
// own text is ignored.
const SchemaFile = "SCHEMA"

// maxSchemaFileBytes bounds what is read of SchemaFile (a canonical schema is well under 1 KiB
// unless its strings are long).
const maxSchemaFileBytes = 64 << 10

// parseCanonical parses a canonical schema text; it fails unless the text is exactly what
// Canonical writes for the result.
func parseCanonical(text string) (Schema, Layout, error) {
	var s Schema
	var l Layout
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) != 12 || lines[0] != "ucm-schema/1" {
		return s, l, fmt.Errorf("schema text: want 12 lines starting ucm-schema/1: %w", ErrCorrupt)
	}
	fields := map[string]string{}
	for _, line := range lines[1:] {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return s, l, fmt.Errorf("schema text: line %q: %w", line, ErrCorrupt)
		}
		fields[k] = v
	}
	var err error
	str := func(k string) string {
		v, uerr := strconv.Unquote(fields[k])
		if uerr != nil && err == nil {
			err = fmt.Errorf("schema text: %s: %w", k, ErrCorrupt)
		}
		return v
	}
	num := func(k string) int64 {
		v, perr := strconv.ParseInt(fields[k], 10, 64)
		if perr != nil && err == nil {
			err = fmt.Errorf("schema text: %s: %w", k, ErrCorrupt)
		}
		return v
	}
	s.Model, s.DType, s.KVLayout, s.Extra = str("model"), str("dtype"), str("kv_layout"), str("extra")
	s.TPRank, s.TPSize, s.BlockTokens = int(num("tp_rank")), int(num("tp_size")), int(num("block_tokens"))
	l.Shards, l.TensorsPerShard, l.ShardBytes = int(num("shards")), int(num("tensors_per_shard")), num("shard_bytes")
	if err != nil {
		return s, l, err
	}
	if s.HashScheme, err = ParseHashScheme(fields["hash_scheme"]); err != nil {
		return s, l, fmt.Errorf("schema text: %w: %w", ErrCorrupt, err)
	}
	if err := l.Validate(); err != nil {
		return s, l, fmt.Errorf("schema text: %w: %w", ErrCorrupt, err)
	}
	if s.Canonical(l) != text {
		return s, l, fmt.Errorf("schema text: not in canonical form: %w", ErrCorrupt)
	}
	return s, l, nil
}

// readSchemaFile returns the schema and layout SchemaFile records; ok is false when there is
// no usable file (missing, unreadable, too long or not canonical: logged).
func (e *Engine) readSchemaFile() (Schema, Layout, bool) {
	path := filepath.Join(e.dir, SchemaFile)
	f, err := e.fs.Open(path)
	if err != nil {
		return Schema{}, Layout{}, false
	}
	defer func() { _ = f.Close() }()
	buf := make([]byte, maxSchemaFileBytes+1)
	n, err := f.ReadAt(buf, 0)
	if (err != nil && err != io.EOF) || n > maxSchemaFileBytes {
		e.opts.Logger.Warn("ucm: schema file unreadable or too long; ignored", "path", path, "err", err)
		return Schema{}, Layout{}, false
	}
	s, l, err := parseCanonical(string(buf[:n]))
	if err != nil {
		e.opts.Logger.Warn("ucm: schema file does not parse; ignored", "path", path, "err", err)
		return Schema{}, Layout{}, false
	}
	return s, l, true
}

// writeSchemaFile records the store's schema in SchemaFile unless it is there already.
func (e *Engine) writeSchemaFile() error {
	if e.opts.ReadOnly {
		return nil
	}
	want := e.opts.Schema.Canonical(e.opts.Layout)
	if s, l, ok := e.readSchemaFile(); ok && s.Canonical(l) == want {
		return nil
	}
	path := filepath.Join(e.dir, SchemaFile)
	if err := wal.ReplaceFile(e.fs, path, path+".tmp", []byte(want)); err != nil {
		return fmt.Errorf("open %s: record the schema file: %w", e.dir, err)
	}
	return nil
}
