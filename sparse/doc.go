// Package sparse holds the sparse-attention methods of UCM: the SparseMethod interface with its
// scheduler and worker hooks (no-op defaults in Base), a registry creating methods by name from
// ucm_sparse_config.<Name> or ENABLE_SPARSE / UCM_SPARSE_TYPE, and block selection from stored
// representations (sidecars, package kernels and engine.LoadSidecars) for Quest, ESA, GSA (its
// 000 scoring), GSA On-Device and KVStar MultiStep. Selection reads sidecars only, never whole
// blocks. Blend reuses the stored K/V of chunks at other positions (position-independent chunk
// ids, chunk matching, RoPE correction, HKVD selective recompute); ReRoPE gives the kernels of
// windowed RoPE scores over a three-tensor cache page. docs/sparse.md says what is built, what
// is not yet, and the choices made where the sources disagree.
//
// Comments cite what UCM's design documents specify as "sources §n": section n of
// docs/sparse-sources.md, which digests them (000, 002 and 003 name the documents there).
package sparse
