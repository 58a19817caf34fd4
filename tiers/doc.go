// Package tiers will hold the memory, SSD and shared-file-system tiers: placement across
// paths, exact per-tier capacity, global LRU eviction, promotion/demotion and compaction.
// It is built by the tiers issue on top of wal and index.
package tiers
