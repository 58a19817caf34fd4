package ucmconfig

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/tiers"
)

// StoresDir is the directory under the first storage backend that holds the store directories
// (index, lock) of the instances sharing it (InstanceStore), one subdirectory per layout
// namespace (LayoutNamespace).
const StoresDir = "stores"

// LayoutNamespace returns the name of the directory under StoresDir that holds the instance
// stores of one schema and layout: the first 8 bytes of engine.Schema.Fingerprint(l) in hex (16
// digits). Two configurations share a namespace only if their fingerprints agree in those
// bytes; a store still checks the whole fingerprint at engine.Open (ErrSchemaMismatch), so even a
// collision never serves bytes of another layout.
func LayoutNamespace(s engine.Schema, l engine.Layout) string {
	fp := s.Fingerprint(l)
	return hex.EncodeToString(fp[:8])
}

// InstanceStore is StoreOptions for one of several processes configured with the same
// storage_backends, as UCM's stores are used: vLLM's tensor-parallel workers on one host, and hosts
// sharing a file system. Where StoreOptions makes storage_backends[0] the store directory (one
// process only: a second one gets engine.ErrLocked), InstanceStore makes the storage backends a
// shared disk tier (docs/sharing.md) and gives the process its own store directory,
// <storage_backends[0]>/stores/<LayoutNamespace(s, l)>/<name>, with opts.Schema and opts.Layout set
// to s and l. name identifies the process across restarts (a worker that comes back with the same
// name and layout finds its own blocks); it must be one path element.
//
// Each schema and layout has its own namespace: a process started with another block size or
// tensor sizes (another model, another TP size) under the same name gets a new, empty store
// instead of ErrSchemaMismatch, and the stores of the old layout stay as they are, found again
// when it comes back. On the shared tier, an instance of one layout ignores the segments of
// the others (their headers and manifests carry another fingerprint): a block stored under one
// layout is a miss under another, never bytes of the wrong shape.
//
// A store left at the pre-namespace place <storage_backends[0]>/stores/<name> whose SCHEMA
// file records s and l is moved into its namespace (under its lock; engine.ErrLocked when a process
// runs it), so that an upgrade keeps its blocks; one of another layout stays until that layout
// opens it; one without a readable SCHEMA file stays where it is, logged with how to move it.
//
// The disk tier made from storage_backends (no tiers key: the default one, or UCM's
// posix_capacity_gb tier) becomes shared; a tier list given in the config is used as written
// (mark its shared tier there).
func (c *Config) InstanceStore(name string, s engine.Schema, l engine.Layout) (dir string, opts engine.Options, err error) {
	if err := checkInstanceName(name); err != nil {
		return "", opts, err
	}
	base, opts, err := c.StoreOptions()
	if err != nil {
		return "", opts, err
	}
	backends := c.Connectors[0].Config.StorageBackends
	switch {
	case len(opts.Tiers) == 0:
		opts.Tiers = []tiers.Config{{Name: defaultDiskTierKey, Kind: tiers.KindDisk, Paths: append([]string(nil), backends...), Shared: true}}
	case len(c.Connectors[0].Config.Tiers) == 0:
		for i := range opts.Tiers {
			if opts.Tiers[i].Kind == tiers.KindDisk && slices.Equal(opts.Tiers[i].Paths, []string(backends)) {
				opts.Tiers[i].Shared = true
			}
		}
	}
	opts.Schema, opts.Layout = s, l
	dir = filepath.Join(base, StoresDir, LayoutNamespace(s, l), name)
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	mode := opts.DirMode
	if mode == 0 {
		mode = engine.DefaultDirMode
	}
	if err := engine.MoveStore(filepath.Join(base, StoresDir, name), dir, s, l, mode, log); err != nil {
		return "", opts, err
	}
	return dir, opts, nil
}

func checkInstanceName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) {
		return fmt.Errorf("config: instance name %q: want one non-empty path element: %w", name, engine.ErrInvalidArgument)
	}
	return nil
}

// InstanceStores returns every store directory of the instance name under the first storage
// backend, whatever its layout: <storage_backends[0]>/stores/*/<name>, and the pre-namespace
// <storage_backends[0]>/stores/<name> when it is one, sorted; engine.ErrNotFound when there is
// none. It is for tools that open a store with the schema it recorded
// (engine.Options.AdoptStoredSchema) and know the name only.
func (c *Config) InstanceStores(name string) ([]string, error) {
	if err := checkInstanceName(name); err != nil {
		return nil, err
	}
	base, _, err := c.StoreOptions()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(base, StoresDir)
	entries, err := os.ReadDir(root)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("config: list %s: %w", root, err)
	}
	var out []string
	if engine.IsStoreDir(filepath.Join(root, name)) {
		out = append(out, filepath.Join(root, name))
	}
	for _, e := range entries {
		if d := filepath.Join(root, e.Name(), name); e.IsDir() && engine.IsStoreDir(d) {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("config: no store of instance %q (looked for %s and %s): %w", name,
			filepath.Join(root, "*", name), filepath.Join(root, name), engine.ErrNotFound)
	}
	slices.Sort(out)
	return out, nil
}
