"""Start-up without the cyclic garbage collector.

Importing torch, the HTTP stack and the engine creates about a million objects and almost no garbage,
yet each allocation burst triggers a collection that walks them all: about 0.2 of the 1.5 s those
imports take on a 2-core EPYC. `collector_paused` turns the collector off for such a block, then
freezes what survived (`gc.freeze`: moved to a generation no later collection scans), so serving
does not walk the start-up objects either. They are unfrozen at exit, so that the interpreter's last
collection still finalises them (nanobind-based modules report what is left as leaks).
"""

import atexit
import contextlib
import gc


@contextlib.contextmanager
def collector_paused():
    """No cyclic collection inside the block; its survivors are frozen when it ends."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        atexit.unregister(gc.unfreeze)  # registered once, however many blocks there are
        atexit.register(gc.unfreeze)
        if was_enabled:
            gc.enable()
