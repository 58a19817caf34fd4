"""ucmgo.sparse: UCM-Go's sparse-attention retrieval from Python (docs/connector.md, "Sparse
retrieval").

ucmgo.sparse.esa.retrieval_backend.RetrievalWorkerBackend is a drop-in for UCM's ESA CPU
module (ucm.sparse.esa.retrieval.retrieval_backend): same constructor, submit, poll, wait and
get_result, backed by libucmgo.so's retriever ABI.
"""
