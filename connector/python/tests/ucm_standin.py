"""A stand-in for UCM's package layout (ucm.store.ucmstore_v1, ucm.store.factory_v1) with the
same names and the behaviour its factory has: create_connector imports module_path and asserts
the class subclasses UcmKVStoreBaseV1. Used by test_store.py and, by path, installed_check.py
(which runs isolated, outside the repository)."""

UCM_STANDIN = {
    "ucm/__init__.py": "",
    "ucm/store/__init__.py": "",
    "ucm/store/ucmstore_v1.py": (
        "from abc import ABC\n"
        "class Task(ABC):\n    pass\n"
        "class UcmKVStoreBaseV1(ABC):\n"
        "    def __init__(self, config):\n        self.config = config\n"
    ),
    "ucm/store/factory_v1.py": (
        "import importlib\n"
        "from ucm.store.ucmstore_v1 import UcmKVStoreBaseV1\n"
        "class UcmConnectorFactoryV1:\n"
        "    _registry = {}\n"
        "    @classmethod\n"
        "    def register_connector(cls, name, module_path, class_name):\n"
        "        if name in cls._registry:\n            raise ValueError(name)\n"
        "        cls._registry[name] = lambda: getattr(importlib.import_module(module_path), class_name)\n"
        "    @classmethod\n"
        "    def create_connector(cls, connector_name, config, module_path=None):\n"
        "        if module_path:\n"
        "            connector_cls = getattr(importlib.import_module(module_path), connector_name)\n"
        "        else:\n            connector_cls = cls._registry[connector_name]()\n"
        "        assert issubclass(connector_cls, UcmKVStoreBaseV1)\n"
        "        return connector_cls(config)\n"
    ),
}
