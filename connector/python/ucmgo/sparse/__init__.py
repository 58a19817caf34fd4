"""ucmgo.sparse: UCM-Go's sparse attention from Python (docs/connector.md).

Selector computes and stores a block's representations beside it in a UcmGoStore, loads them by
block id and selects the blocks a decode step attends ("Sparse selection").
ucmgo.sparse.esa.retrieval_backend.RetrievalWorkerBackend is a drop-in for UCM's ESA CPU module
(ucm.sparse.esa.retrieval.retrieval_backend): same constructor, submit, poll, wait and
get_result, backed by libucmgo.so's retriever ABI over rows the caller holds ("Sparse
retrieval"); StoreRetrievalBackend beside it takes a Selector and block ids instead of the
rows, reading the stored representations by id (Selector.retrieve_dot); ucmgo.sparse.kvstar.kvstar_retrieve (KVStar's kvstar_retrieve: Setup,
AsyncRetrieveByCPU, Wait, GetTaskResult) and ucmgo.sparse.gsa.gsa_offload_ops (GSA's
CalKpreAndTopk) are the drop-ins for UCM's other two CPU modules.
"""

from .selector import SelectTask, Selector

__all__ = ["Selector", "SelectTask"]
