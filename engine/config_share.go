package engine

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ucm-go/ucm/tiers"
)

// StoresDir is the directory under the first storage backend that holds the store directories
// (index, lock) of the instances sharing it (InstanceStore).
const StoresDir = "stores"

// InstanceStore is StoreOptions for one of several processes configured with the same
// storage_backends, as UCM's stores are used: vLLM's tensor-parallel workers on one host, and
// hosts sharing a file system. Where StoreOptions makes storage_backends[0] the store directory
// (one process only: a second one gets ErrLocked), InstanceStore makes the storage backends a
// shared disk tier (docs/sharing.md) and gives the process its own store directory,
// <storage_backends[0]>/stores/<name>. name identifies the process across restarts (a worker
// that comes back with the same name finds its own blocks); it must be one path element.
//
// The disk tier made from storage_backends (no tiers key: the default one, or UCM's
// posix_capacity_gb tier) becomes shared; a tier list given in the config is used as written
// (mark its shared tier there).
func (c *Config) InstanceStore(name string) (dir string, opts Options, err error) {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) {
		return "", opts, fmt.Errorf("config: instance name %q: want one non-empty path element: %w", name, ErrInvalidArgument)
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
	return filepath.Join(base, StoresDir, name), opts, nil
}
