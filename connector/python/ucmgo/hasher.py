"""UCM's block ids, bit for bit (ucm/integration/vllm/ucm_connector.py RequestHasher)."""

import hashlib
import pickle
from typing import List, Optional, Sequence

SEED_INPUT = "UCM_HASH_SEED"


class RequestHasher:
    """md5(meta ‖ x) with meta = "model:tp_size:dtype:rank" (UTF-8), x the bytes given or
    pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL), exactly as UCM's connector hashes.

    dtype is rendered with str(), so pass what UCM's connector passes: vLLM's
    model_config.dtype, a torch.dtype, whose str() is e.g. "torch.bfloat16". A plain
    "bfloat16" gives other ids: blocks dumped by UCM would all miss. The Go API's HashMeta
    (connector/ucmhash.HashMeta.DType) takes the same string.
    """

    def __init__(self, vllm_config=None, rank_id: int = 0, *, model: Optional[str] = None,
                 tp_size: Optional[int] = None, dtype=None):
        if vllm_config is not None:
            model = vllm_config.model_config.model
            tp_size = vllm_config.parallel_config.tensor_parallel_size
            dtype = vllm_config.model_config.dtype
        if model is None or tp_size is None or dtype is None:
            raise ValueError("RequestHasher needs a vllm_config, or model, tp_size and dtype")
        self.meta = f"{model}:{tp_size}:{dtype}:{rank_id}"
        self.meta_bytes = self.meta.encode("utf-8")

    def __call__(self, input_data) -> bytes:
        if isinstance(input_data, bytes):
            data = input_data
        else:
            data = pickle.dumps(input_data, protocol=pickle.HIGHEST_PROTOCOL)
        return hashlib.md5(self.meta_bytes + data).digest()

    def seed(self) -> bytes:
        """The chain's seed: hasher("UCM_HASH_SEED")."""
        return self(SEED_INPUT)

    def block_ids(self, token_ids: Sequence[int], block_size: int, parent: Optional[bytes] = None) -> List[bytes]:
        """The ids of the full blocks of token_ids: id[i] = hasher((id[i-1], tuple(block i's
        tokens))), id[-1] = parent or the seed. A trailing partial block has no id."""
        if block_size < 1:
            raise ValueError("block_size %d: want >= 1" % block_size)
        prev = self.seed() if parent is None else parent
        out = []
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            prev = self((prev, tuple(token_ids[start:start + block_size])))
            out.append(prev)
        return out

    def for_rank(self, rank_hasher: "RequestHasher", ids: Sequence[bytes], rank: int) -> List[bytes]:
        """A non-MLA tensor-parallel rank's ids: rank 0 keeps the scheduler's ids, others
        re-hash each with their own meta (md5(meta_rank ‖ id))."""
        return list(ids) if rank == 0 else [rank_hasher(x) for x in ids]
