// Package tiers holds the building blocks of the memory, SSD and shared-file-system tiers:
//
//   - Config, Validate and PathFor: tier configuration (fastest first, an optional memory tier
//     then disk tiers), its checks, and the placement of segments across a tier's paths.
//   - MemCache: the memory tier, a host-DRAM LRU of whole blocks with an exact byte cap.
//   - LRU: the global, prefix-chain-aware recency order of one disk tier, which picks eviction
//     victims leaves first and never a pinned block or its ancestors.
//
// Each is self-contained and safe for concurrent use; the engine wires them to wal and index
// (space accounting, segment reclamation, promotion and demotion live there).
package tiers
