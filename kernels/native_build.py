"""Compile the C++ CPU kernels, one build per instruction-set variant, and load them with ctypes.

Each variant (`cpu_isa.KernelVariant`: portable x86-64-v2, AVX2+FMA x86-64-v3, AVX-512 x86-64-v4,
AVX512-BF16) is built with the system C++ compiler into ``<cache root>/kernels/<hash>/``, keyed
by the sources, the compiler and the flags, so a changed source rebuilds and every variant can be
built and tested on any x86-64 host, whether or not it can run it. Which variant the engine loads is
decided at run time from what the CPU reports (`cpu_isa.best_variant`). No compiler, or a failed
build, is not an error: the caller gets None and keeps the pure-torch path; the reason is logged once.
"""

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from spyglass.kernels.cpu_isa import KernelVariant

log = logging.getLogger(__name__)

_SOURCE_DIR = Path(__file__).parent / "native"
_FLAGS = ("-O3", "-ffast-math", "-fopenmp", "-fPIC", "-shared", "-std=c++17")


def cache_root() -> Path:
    """Where built kernels are kept: ``$SPYGLASS_CACHE_DIR`` or ``~/.cache/spyglass``."""
    return Path(os.environ.get("SPYGLASS_CACHE_DIR") or Path.home() / ".cache" / "spyglass")


def compiler() -> str | None:
    """The C++ compiler to use: ``$CXX``, else g++ or c++ from the PATH; None when there is none."""
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _build(command: list[str], target: Path) -> None:
    """Run ``command`` (which writes its output to its last argument) into ``target`` atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        partial = Path(scratch) / target.name
        subprocess.run([*command, str(partial)], check=True, capture_output=True, text=True)
        os.replace(partial, target)


def library_path(name: str, variant: KernelVariant) -> Path:
    """Build ``native/<name>.cpp`` for ``variant`` unless it is cached; the shared library's path.

    Raises ``OSError`` or ``subprocess.CalledProcessError`` when it cannot be built.
    """
    cxx = compiler()
    if cxx is None:
        raise OSError("no C++ compiler found (install g++)")
    source = _SOURCE_DIR / f"{name}.cpp"
    flags = (*_FLAGS, *variant.march)
    inputs = b"".join(path.read_bytes() for path in [source, *sorted(_SOURCE_DIR.glob("*.h"))])
    key = hashlib.sha256(inputs + " ".join((cxx, *flags)).encode()).hexdigest()
    target = cache_root() / "kernels" / key[:16] / f"{name}-{variant.name}.so"
    if not target.exists():
        log.info("compiling the %s CPU kernel (%s)", name, variant.name)
        _build([cxx, *flags, str(source), "-o"], target)
    return target


@functools.cache
def load(name: str, variant: KernelVariant) -> ctypes.CDLL | None:
    """The compiled ``native/<name>.cpp`` for ``variant`` as a ctypes library, or None when it cannot be built.

    The caller must only load a variant the CPU executes (`cpu_isa.runnable_variants`).
    ``SPYGLASS_NATIVE_KERNELS=0`` disables the native kernels (the torch path is used instead).
    """
    if os.environ.get("SPYGLASS_NATIVE_KERNELS", "1") == "0":
        return None
    try:
        return ctypes.CDLL(str(library_path(name, variant)))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        log.warning(
            "could not build the %s CPU kernel (%s); using the pure-torch path", name, detail
        )
        return None
