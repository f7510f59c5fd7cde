"""Host allocator tuning for CPU inference."""

import ctypes
import logging
import math
import mmap
import sys
from pathlib import Path

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


_THP = Path("/sys/kernel/mm/transparent_hugepage")


def _selected(setting: str) -> str:
    """The bracketed choice of a THP setting file ("always [madvise] never" -> "madvise"), or ""."""
    try:
        text = (_THP / setting).read_text()
    except OSError:
        return ""
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else ""


def huge_pages_fault_without_stalls() -> bool:
    """Whether advising huge pages for the KV cache can only help here.

    With THP on (``always`` or ``madvise``) and ``defrag`` set to ``defer`` or ``never``, a fault in
    advised memory takes a huge page if one is free and a small one otherwise. Other ``defrag``
    settings compact memory inside the fault for advised regions: on a 2-core VM with ``madvise``
    that made first touches of a 1 GiB cache take 3.1 s instead of 0.55 s (10% of a W1 run), while
    the pages obtained were still small.
    """
    return _selected("enabled") in ("always", "madvise") and _selected("defrag") in (
        "defer",
        "never",
    )


def zeros_in_fresh_mapping(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor in its own anonymous mapping, on huge pages where that cannot stall.

    The paged KV cache is read in scattered 2 KiB pieces (one block of one head); on 4 KiB pages
    nearly every piece is a TLB miss, so huge pages are asked for where faults do not compact
    memory to find them (`huge_pages_fault_without_stalls`). A fresh mapping, not the malloc heap:
    memory the heap hands back was often faulted in already as small pages (by a previous engine,
    say), and advice given afterwards does not change those. A fresh anonymous mapping reads as
    zeros already, so nothing is written here: pages fault in as blocks are first used rather than
    all at start (zeroing a 2 GiB cache took seconds of every start).
    """
    element_size = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(shape) * element_size
    if not sys.platform.startswith("linux") or nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge_pages_fault_without_stalls():
        region.madvise(mmap.MADV_HUGEPAGE)
    # The tensor holds a reference to the mapping, which lives as long as the tensor does.
    return torch.frombuffer(region, dtype=dtype).view(shape)
