"""Host allocator tuning for CPU inference."""

import ctypes
import logging
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


_MADV_HUGEPAGE = 14
_HUGE_PAGE = 2 << 20


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor whose pages the kernel is asked to back with 2 MiB huge pages.

    The paged KV cache is read in scattered 2 KiB pieces (one block of one head); on 4 KiB pages
    nearly every piece is a TLB miss. The advice is given before the memory is first touched, so
    the zeroing faults in huge pages directly; where it is refused, the tensor is simply zeroed.
    """
    tensor = torch.empty(shape, dtype=dtype)
    if sys.platform.startswith("linux") and tensor.numel():
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        aligned_start = -(-start // _HUGE_PAGE) * _HUGE_PAGE
        aligned_end = end // _HUGE_PAGE * _HUGE_PAGE
        if aligned_end > aligned_start:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            libc.madvise(aligned_start, aligned_end - aligned_start, _MADV_HUGEPAGE)
    return tensor.zero_()
