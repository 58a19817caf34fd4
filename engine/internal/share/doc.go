// Package share is the sharing of an engine's shared tiers: several engine instances on one
// shared file system, each writing only its own namespace (docs/sharing.md).
//
// Guarantees:
//
//   - Publication: an instance lists its sealed segments in its namespace's manifest
//     (Publish) once they are durable, and no longer once it retires them; a retired
//     segment's file is unlinked a grace period later (RetireShared), or at FinishGrace when
//     the instance closes, so readers on other instances finish with it.
//   - Visibility: the other instances' published segments are indexed in the foreign index,
//     a second Pebble index of this instance's own (a cache: rebuilt from the manifests,
//     summaries and footers when lost), refreshed every RefreshInterval (Run); blocks they
//     announce in their publication logs before publishing are in an in-memory overlay
//     (RunTailer, TailPublogs). Get, Contains and OverlayHas never touch the shared file
//     system; GetTailing may read the publication logs on a miss.
//   - Entries never outlive their segment: an alias (IsForeign) stands for its segment
//     before any entry names it, and a segment leaves with its entries, its alias and its
//     remembered copies; a block another indexed segment holds moves to that copy.
//   - Reclamation: the lease holder of a tier with a capacity grants shares and asks for
//     retirements through the manifests' notes; segments of an instance presumed gone
//     (its manifest unchanged for OwnerTimeout) are reclaimed by the lease holder.
//
// Concurrency: a Sharing's methods are safe for concurrent use. It reaches the rest of the
// engine only through its Env, whose documentation says which methods may be called with the
// Sharing's lock held. Lock order: the engine's reclaimer lock, then its segments' lock, then
// the Sharing's locks; OpenForeign is called with the segments' lock held and takes only the
// Sharing's own.
//
// Usage (the engine's, in outline):
//
//	s, err := share.Open(cfg, env) // nil, nil: read-only and no readable foreign index
//	go s.Run()                     // publish and refresh; ends when cfg.Stop closes
//	go s.RunTailer()
//	loc, ok := s.Get(id)           // a lookup after the engine's own index missed
//	...
//	s.FinishGrace() // after the background goroutines ended
//	s.Publish()     // the segments the writers sealed at close
//	s.ClosePublogs()
//	_ = s.ForeignIndex().Close()
package share
