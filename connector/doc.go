// Package connector is what an inference engine embeds to use UCM-Go as a UCM store: Store
// implements UCM's store interface (UcmKVStoreBaseV1: lookup, lookup_on_prefix, prefetch,
// load/dump of shards from and into host memory the caller owns, wait, check, V0
// create/commit) over an engine instance, configured by UCM's own configuration (a YAML file,
// or the dict UCM's connector hands its store), with UCM's status codes and UCM's ucm:
// metrics. connector/capi exports it as a C library (libucmgo.so, ucmgo.h) and
// connector/python/ucmgo wraps that for Python; docs/connector.md shows a UCM user the switch.
//
// Every process configured with the same storage_backends (vLLM's tensor-parallel workers,
// its scheduler, other hosts on a shared file system) opens its own instance there and sees
// the blocks of all the others (docs/sharing.md): nobody gets ErrLocked for sharing a path.
package connector
