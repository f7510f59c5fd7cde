"""Host allocator tuning for CPU inference."""

import ctypes
import logging
import math
import mmap
import sys

import torch

log = logging.getLogger("spyglass.engine")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory_mapped() -> None:
    """Make glibc reuse freed memory for large tensors instead of returning it to the OS.

    Every step allocates multi-megabyte temporaries (gathered KV, activations). By default glibc
    serves each from a fresh mmap whose pages fault in on first touch, which made copies run at a
    fifth of memory bandwidth here. Raising the mmap and trim thresholds keeps them on the heap.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        log.info("not glibc: allocator thresholds left as they are")
        return
    libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30)
    libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1)


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor in its own anonymous mapping, which the kernel is asked to back with huge pages.

    The paged KV cache is read in scattered 2 KiB pieces (one block of one head); on 4 KiB pages
    nearly every piece is a TLB miss. A fresh mapping, not the malloc heap: memory the heap hands
    back was often faulted in already as small pages (by a previous engine, say), and advice given
    afterwards does not change those. A fresh anonymous mapping reads as zeros already, so nothing is
    written here: pages fault in as blocks are first used rather than all at start (zeroing a 2 GiB
    cache took seconds of every start). Where huge pages are unavailable the advice is ignored.
    """
    element_size = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(shape) * element_size
    if not sys.platform.startswith("linux") or nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    # The tensor holds a reference to the mapping, which lives as long as the tensor does.
    return torch.frombuffer(region, dtype=dtype).view(shape)
