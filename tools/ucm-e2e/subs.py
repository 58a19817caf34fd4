"""The substitutions the e2e runner applies to UCM's V1 store scripts, and nothing else.

Each script gets a table of (kind, old, new, count) rows applied in order as literal text
replacements. kind says why the row exists:

  store   UCM's store class or module -> module ucmgo, class UcmGoStore
  device  cuda -> cpu (this machine has no GPU): device strings, torch.cuda.set_device,
          .to("cuda:0"), cupy pinned host memory -> an mmap host buffer (ucm_e2e_hostmem)
  size    counts of blocks, batches, epochs or workers cut to fit a 2-core machine with
          ~80 GB of free disk and 24 GB of RAM, each script in about a minute

count is how many times old must occur in the script at that point: a different number (UCM
changed the script) is an error naming the script and the row, so that a substitution is never
silently skipped or applied somewhere new. Config keys and assertions are never touched; after
the table, no "cuda", "cupy" or UCM store class may remain (checked too).
"""

STORE, DEVICE, SIZE = "store", "device", "size"

# The factory form: UcmConnectorFactoryV1.create_connector(class_name, config, module_path).
_FACTORY = [
    (STORE, 'module_path = "ucm.store.pipeline.connector"', 'module_path = "ucmgo"', 1),
    (STORE, 'class_name = "UcmPipelineStore"', 'class_name = "UcmGoStore"', 1),
]

# The direct form: from ucm.store.pipeline.connector import UcmPipelineStore, then the
# class in two type hints and two constructor calls.
_DIRECT = [
    (STORE, "from ucm.store.pipeline.connector import UcmPipelineStore", "from ucmgo import UcmGoStore", 1),
    (STORE, "UcmPipelineStore", "UcmGoStore", 4),
]

_CUDA_TENSOR = ('device="cuda:{}".format(device_id)', 'device="cpu"')

SCRIPTS = {
    "posixstore_aio_test": _FACTORY,  # 64 blocks of 8 MiB, dumped and loaded 32 times: fits
    "posixstore_embed": _FACTORY + [
        # 64 batches of 1,024 new 1 MiB blocks: 64 GiB written.
        (SIZE, "batch_number = 64", "batch_number = 4", 1),
    ],
    "posixstore_gc_test": _FACTORY + [
        # As posixstore_embed (64 GiB written); posix_capacity_gb stays 60, so GC does not
        # trigger at this size.
        (SIZE, "batch_number = 64", "batch_number = 4", 1),
    ],
    "cache_on_posix_test": _DIRECT + [
        (DEVICE,) + _CUDA_TENSOR + (1,),
        # 512 batches of 64 blocks of 8 MiB: 256 GiB written.
        (SIZE, "test_batch_number = 512", "test_batch_number = 8", 1),
    ],
    "cache_on_posix_hit_test": _FACTORY + [
        (DEVICE, 'make_tensors("cuda:{}".format(device_id))', 'make_tensors("cpu")', 1),
        # 1,024 blocks of 4 MiB, three tensor sets alive at once: 12 GiB of RAM.
        (SIZE, "block_number = 1024", "block_number = 256", 1),
    ],
    "cache_layer_chunk_test": _DIRECT + [
        (DEVICE,) + _CUDA_TENSOR + (1,),
    ],
    "cache_variable_length_tensor_test": _DIRECT + [
        (DEVICE,) + _CUDA_TENSOR + (2,),
    ],
    "cache_on_empty_test": _DIRECT + [
        (DEVICE,) + _CUDA_TENSOR + (1,),
        # 512 batches of 64 blocks of 8 MiB.
        (SIZE, "test_batch_number = 512", "test_batch_number = 8", 1),
    ],
    "cache_on_empty_mp_test": _FACTORY + [
        (DEVICE, 'torch.cuda.set_device(device="cuda:{}".format(device_id))',
         "pass  # no device to select on CPU", 1),
        (DEVICE,) + _CUDA_TENSOR + (1,),
        (DEVICE, 't.to("cuda:0")', 't.to("cpu")', 1),
    ],
    "ds3fs_test": [
        (STORE, "from ucm.store.ds3fs.connector import UcmDs3fsStore", "from ucmgo import UcmGoStore", 1),
        (STORE, "UcmDs3fsStore(ds3fs_config)", "UcmGoStore(ds3fs_config)", 1),
        (DEVICE, "import cupy", "import ucm_e2e_hostmem", 1),
        (DEVICE, "cupy.cuda.alloc_pinned_memory(block_size)", "ucm_e2e_hostmem.alloc_pinned_memory(block_size)", 2),
        # 64 batches of 256 blocks of 16 MiB (4 GiB of source, its copy and the destination
        # alive at once: 12 GiB of RAM per batch).
        (SIZE, "block_num = 256", "block_num = 32", 1),
        (SIZE, "test_batch_number = 64", "test_batch_number = 4", 1),
    ],
    "pcstore_embed_v1": [
        (STORE, "from ucm.store.pcstore.pcstore_connector_v1 import UcmPcStoreV1", "from ucmgo import UcmGoStore", 1),
        (STORE, "return UcmPcStoreV1(config)", "return UcmGoStore(config)", 1),
        (DEVICE,) + _CUDA_TENSOR + (1,),
        # 4,096 blocks of 4.3 MiB in batches of 256 (18 GiB written).
        (SIZE, "block_number = 4096", "block_number = 1024", 1),
    ],
}

# Left in no script after its table: a device or UCM store the table missed.
FORBIDDEN = ["cuda", "cupy", "UcmPipelineStore", "UcmPcStoreV1", "UcmDs3fsStore", "ucm.store.pipeline",
             "ucm.store.pcstore", "ucm.store.ds3fs"]


class SubstitutionError(Exception):
    """A row of a script's table did not match the script as expected."""


def substitute(name: str, text: str, table=None) -> str:
    """Applies SCRIPTS[name] (or table) to text; raises SubstitutionError when a row's old text
    does not occur exactly count times, or when FORBIDDEN text remains afterwards."""
    rows = SCRIPTS[name] if table is None else table
    for i, (kind, old, new, count) in enumerate(rows):
        got = text.count(old)
        if got != count:
            raise SubstitutionError(
                "%s: %s row %d expects %r %d time(s), found %d: UCM's script changed, update "
                "tools/ucm-e2e/subs.py" % (name, kind, i, old, count, got))
        text = text.replace(old, new)
    for word in FORBIDDEN:
        if word in text:
            line = next(n for n, s in enumerate(text.splitlines(), 1) if word in s)
            raise SubstitutionError(
                "%s: %r is left at line %d after the substitutions: UCM's script changed, "
                "update tools/ucm-e2e/subs.py" % (name, word, line))
    return text
