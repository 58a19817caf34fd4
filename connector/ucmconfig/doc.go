// Package ucmconfig reads UCM's YAML configuration, as UCM users write it, and turns it into
// what engine.Open takes: a store directory and engine.Options. It is an adapter for UCM users;
// the engine knows nothing of YAML.
//
// What it guarantees:
//
//   - Every key UCM's stores, pipeline, connectors and examples pass is accepted (UCMKeys lists
//     each with what UCM means and what UCM-Go does with it); keys that select nothing are
//     named by Config.Unused, for the opener to log once. Any other key is an error naming the
//     key, its line and the closest known key: a typo never silently selects a default.
//   - Numbers are taken exactly: a fraction where a whole number belongs, a value beyond what
//     the key's field or its converted form holds, NaN or an infinity is an error naming the
//     key, its line and the value as written. Sizes take binary units (ParseSize).
//   - Every error wraps engine.ErrInvalidArgument (test with errors.Is).
//   - StoreOptions gives the store directory and engine.Options; the caller fills Layout and
//     Schema (they come from the model served), and engine.Open validates the rest, naming the
//     field at fault.
//   - InstanceStore gives each process configured with the same storage_backends its own store
//     directory, <storage_backends[0]>/stores/<LayoutNamespace>/<name>, with the backends as a
//     shared tier (docs/sharing.md).
//
// Usage:
//
//	cfg, err := ucmconfig.LoadConfig(path) // parse, then UCM_* environment overrides
//	if err != nil { ... }
//	for _, k := range cfg.Unused() { log.Printf("ucm: key %s has no effect", k) }
//	dir, opts, err := cfg.StoreOptions()
//	opts.Layout, opts.Schema = layout, schema
//	if err := cfg.CheckBlockSize(layout); err != nil { ... }
//	e, err := engine.Open(dir, opts)
//
// The Mooncake tier's `mooncake:` mapping (tiers.MooncakeConfig) is read here too, strictly,
// with its sizes in units.
package ucmconfig
