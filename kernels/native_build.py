"""Compile the C++ CPU kernels once per machine and load them with ctypes.

The library is built with the system C++ compiler for the host CPU (``-march=native``) into
``<spyglass cache>/kernels/<hash>/``, keyed by the sources, the flags and the CPU, so a changed
source or a different machine rebuilds. No compiler, or a failed build, is not an error: the
caller gets None and keeps the pure-torch path; the reason is logged once.
"""

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from spyglass.core.default_model import cache_dir

log = logging.getLogger(__name__)

_SOURCE_DIR = Path(__file__).parent / "native"
_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-shared", "-std=c++17")


def _cpu_identity() -> str:
    """A string that changes when the code would run on a different CPU."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        return next(line for line in cpuinfo.splitlines() if line.startswith("flags")) + platform.machine()
    except (OSError, StopIteration):
        return platform.processor() + platform.machine()


def _build(source: Path, target: Path, compiler: str) -> None:
    """Compile ``source`` into ``target`` atomically (concurrent builders never see half a file)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        partial = Path(scratch) / target.name
        subprocess.run([compiler, *_FLAGS, str(source), "-o", str(partial)], check=True, capture_output=True, text=True)
        os.replace(partial, target)


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """The compiled ``native/<name>.cpp`` as a ctypes library, or None when it cannot be built here.

    ``SPYGLASS_NATIVE_KERNELS=0`` disables the native kernels (the torch path is used instead).
    """
    if os.environ.get("SPYGLASS_NATIVE_KERNELS", "1") == "0":
        return None
    source = _SOURCE_DIR / f"{name}.cpp"
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        log.warning("no C++ compiler found; the CPU uses the pure-torch attention path")
        return None
    inputs = b"".join(path.read_bytes() for path in [source, *sorted(_SOURCE_DIR.glob("*.h"))])
    key = hashlib.sha256(inputs + " ".join((compiler, *_FLAGS, _cpu_identity())).encode()).hexdigest()
    target = cache_dir() / "kernels" / key[:16] / f"{name}.so"
    try:
        if not target.exists():
            log.info("compiling the %s CPU kernel", name)
            _build(source, target, compiler)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        log.warning("could not build the %s CPU kernel (%s); using the pure-torch path", name, detail)
        return None
