"""ucmgo.sparse: sparse attention's block representations and selection over a UcmGoStore."""

from .selector import SelectTask, Selector

__all__ = ["Selector", "SelectTask"]
