"""ucmgo: UCM-Go as a UCM store, for UCM's connector in vLLM (and any Python caller).

    from ucmgo import UcmGoStore
    store = UcmGoStore({"storage_backends": "/mnt/ucm", "device_id": 0,
                        "tensor_size_list": [k, v], "shard_size": k + v, "block_size": ...})

When UCM's ucm package is importable, UcmGoStore subclasses UCM's UcmKVStoreBaseV1 and is
registered with UCM's store factory as "UcmGoStore", so UCM's config selects it with
ucm_connector_name: UcmGoStore (and ucm_connector_module_path: ucmgo). docs/connector.md is
the guide. libucmgo.so comes from `make lib` (or UCMGO_LIB names it); it is loaded when the
first store opens.
"""

from ._lib import (EDESERIALIZE, EDUPLICATE, ENOOBJ, ENOSPACE, EOOM, EOSERROR, EPARAM, ERETRY,  # noqa: F401
                   ERROR, ESERIALIZE, ETIMEOUT, EUNSUPPORTED, OK)
from .hasher import RequestHasher
from .store import HAVE_UCM, UcmGoError, UcmGoStore, UcmGoTask, UcmKVStoreBaseV1

__all__ = ["UcmGoStore", "UcmGoTask", "UcmGoError", "RequestHasher", "UcmKVStoreBaseV1", "HAVE_UCM", "register"]


def register() -> bool:
    """Registers UcmGoStore with UCM's store factory (UcmConnectorFactoryV1) when UCM is
    installed; True when it is (now or already) registered there."""
    try:
        from ucm.store.factory_v1 import UcmConnectorFactoryV1
    except ImportError:
        return False
    try:
        UcmConnectorFactoryV1.register_connector("UcmGoStore", __name__, "UcmGoStore")
    except ValueError:  # already registered
        pass
    return True


register()
