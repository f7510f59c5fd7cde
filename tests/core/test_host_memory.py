"""The KV cache's own mapping: zeroed, writable, and advised onto huge pages only where faults cannot stall."""

import pytest
import torch

from spyglass.core.engine.kv import host_memory


def _thp(tmp_path, monkeypatch, enabled: str, defrag: str) -> None:
    (tmp_path / "enabled").write_text(enabled + "\n")
    (tmp_path / "defrag").write_text(defrag + "\n")
    monkeypatch.setattr(host_memory, "_THP", tmp_path)


@pytest.mark.parametrize(
    "enabled, defrag, advise",
    [
        ("always [madvise] never", "always defer defer+madvise [madvise] never", False),
        ("always [madvise] never", "always [defer] defer+madvise madvise never", True),
        ("[always] madvise never", "always defer defer+madvise madvise [never]", True),
        ("always madvise [never]", "always [defer] defer+madvise madvise never", False),
        ("[always] madvise never", "[always] defer defer+madvise madvise never", False),
    ],
)
def test_huge_pages_only_where_faults_do_not_compact(
    tmp_path, monkeypatch, enabled, defrag, advise
):
    _thp(tmp_path, monkeypatch, enabled, defrag)
    assert host_memory.huge_pages_fault_without_stalls() is advise


def test_no_thp_files_means_no_advice(tmp_path, monkeypatch):
    monkeypatch.setattr(host_memory, "_THP", tmp_path / "missing")
    assert host_memory.huge_pages_fault_without_stalls() is False


@pytest.mark.parametrize("defrag", ["[defer]", "[madvise]"])
def test_the_cache_reads_as_zeros_and_keeps_what_is_written(tmp_path, monkeypatch, defrag):
    _thp(tmp_path, monkeypatch, "always [madvise] never", defrag)
    cache = host_memory.zeros_in_fresh_mapping((2, 3, 16, 8), torch.float32)
    assert cache.shape == (2, 3, 16, 8) and not cache.any()
    cache[1, 2, 15] = 7.0
    assert cache.sum().item() == 56.0
