"""Host memory in place of cupy's pinned host memory (cupy.cuda.alloc_pinned_memory), for
UCM's scripts on a machine without a GPU: page-aligned anonymous memory with the buffer
protocol (np.frombuffer takes it) and .ptr, its address, as cupy's PinnedMemoryPointer has."""

import ctypes
import mmap


class HostMemory(mmap.mmap):
    """size bytes of private anonymous memory; .ptr is the address of its first byte."""

    def __new__(cls, size: int):
        self = super().__new__(cls, -1, size)
        view = ctypes.c_char.from_buffer(self)  # exports the buffer only for this line
        self.ptr = ctypes.addressof(view)
        del view
        return self


def alloc_pinned_memory(size: int) -> HostMemory:
    """size bytes of host memory, as cupy.cuda.alloc_pinned_memory(size) (not page-locked)."""
    return HostMemory(size)
