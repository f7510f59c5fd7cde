"""How `gpu_check` reports: table by table, so that a run cut short keeps what it measured."""

import gc
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch


class Report:
    """The check's tables, each printed as soon as it is measured and appended to ``path`` (a run
    cut short by its time limit keeps what it finished), and all of them again at the end. A
    section that raises is reported as failed, with its traceback, and the next one runs. A
    section whose title holds one of the words in ``skip`` is not run (a second run on a lent GPU
    measures only what changed)."""

    def __init__(self, path: Path | None, skip: tuple[str, ...] = ()):
        self.path = path
        self.skip = skip
        self.lines: list[str] = []

    def section(self, title: str, measure: Callable[[], list[str]]) -> None:
        """Run ``measure`` and report its rows under ``title``, unless it is skipped."""
        if any(word in title for word in self.skip):
            print(f"## {title}: skipped", flush=True)
            return
        started = time.perf_counter()
        try:
            rows = measure()
        except Exception as error:  # one failed measurement must not cost the others
            traceback.print_exc()
            rows = [f"failed: {type(error).__name__}: {error}"]
        gc.collect()
        torch.cuda.empty_cache()
        block = [f"## {title} ({time.perf_counter() - started:.0f} s)", "", *rows, ""]
        self.lines += block
        print("\n".join(block), flush=True)
        if self.path is not None:
            with self.path.open("a") as file:
                file.write("\n".join(block) + "\n")
