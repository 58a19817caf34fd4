// Package engine is the public API of UCM-Go: an embedded, crash-consistent,
// log-structured store for the KV-cache blocks of LLM inference.
package engine
