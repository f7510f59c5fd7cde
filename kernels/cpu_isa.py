"""What the host CPU can execute, read once from the operating system, never assumed.

Everything that depends on the instruction set asks here: the engine's default dtype (bfloat16 only
where the CPU multiplies bf16 natively), oneDNN weight prepacking, and which compiled variant of the
C++ kernels loads (`native_build`). On other architectures than x86-64 the flag set is empty and only
the portable kernel variant is used.
"""

import functools
import platform
from dataclasses import dataclass
from pathlib import Path

# Flags (as /proc/cpuinfo spells them) that make bfloat16 arithmetic native rather than emulated.
_NATIVE_BF16 = ("amx_bf16", "avx512_bf16", "avx_ne_convert")
# What oneDNN's bf16 weight reorder needs (torch raises without it).
_ONEDNN_BF16 = (("avx512bw", "avx512vl", "avx512dq"), ("avx_ne_convert",))


@dataclass(frozen=True, slots=True)
class KernelVariant:
    """One compiled build of the C++ kernels: a name, the compiler flags, and the CPU flags it needs."""

    name: str
    march: tuple[str, ...]
    requires: frozenset[str]


# Best first. x86-64-v2/v3/v4 are the psABI micro-architecture levels; "avx512-bf16" adds the bf16
# dot-product instructions the attention kernel's fastest path uses. AVX-512 builds may also use
# AMX-INT8 tiles where the CPU has them (the quantized matmul asks at run time, `cpu_quant`).
_X86_VARIANTS = (
    KernelVariant(
        "avx512-bf16",
        ("-march=x86-64-v4", "-mavx512bf16", "-mavx512vnni"),
        frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni"}),
    ),
    KernelVariant(
        "avx512",
        ("-march=x86-64-v4",),
        frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}),
    ),
    KernelVariant(
        "avx2", ("-march=x86-64-v3",), frozenset({"avx2", "fma", "f16c", "bmi2", "movbe"})
    ),
    KernelVariant("portable", ("-march=x86-64-v2",), frozenset({"sse4_2", "ssse3", "popcnt"})),
)
_GENERIC_PORTABLE = KernelVariant("portable", (), frozenset())


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (``avx2``, ``avx512_bf16``, ...); empty when unknown."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether bfloat16 matmuls run on bf16 hardware (AMX, AVX512-BF16 or AVX-NE-CONVERT) here."""
    flags = cpu_flags() if flags is None else flags
    return any(flag in flags for flag in _NATIVE_BF16)


def can_prepack_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether oneDNN can reorder bf16 weights into its blocked layout on this CPU."""
    flags = cpu_flags() if flags is None else flags
    return any(all(flag in flags for flag in group) for group in _ONEDNN_BF16)


def kernel_variants() -> tuple[KernelVariant, ...]:
    """Every kernel variant this project builds on this architecture, best first."""
    return _X86_VARIANTS if is_x86_64() else (_GENERIC_PORTABLE,)


def runnable_variants(flags: frozenset[str] | None = None) -> tuple[KernelVariant, ...]:
    """The variants whose instructions this CPU executes, best first (the portable one always)."""
    flags = cpu_flags() if flags is None else flags
    return tuple(v for v in kernel_variants() if v.requires <= flags or v.name == "portable")


def best_variant(flags: frozenset[str] | None = None) -> KernelVariant:
    """The fastest variant this CPU executes."""
    return runnable_variants(flags)[0]


def describe(flags: frozenset[str] | None = None) -> str:
    """A short name for the instruction set found, for the engine's start line (``avx2``, ``avx512-bf16+amx``)."""
    flags = cpu_flags() if flags is None else flags
    name = best_variant(flags).name if is_x86_64() else platform.machine()
    return name + ("+amx" if "amx_bf16" in flags else "")
