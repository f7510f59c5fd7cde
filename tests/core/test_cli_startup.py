"""The CLI answers ``--help`` without importing torch or the engine (importing torch alone takes seconds)."""

import subprocess
import sys

import pytest

_PROBE = """
import sys
from spyglass.core.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
HEAVY = ("torch", "litestar", "uvicorn", "ray", "spyglass.core.engine.engine")
heavy = sorted(name for name in HEAVY if name in sys.modules)
print("HEAVY:" + ",".join(heavy))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["serve", "--help"],
        ["generate", "--help"],
        ["bench", "--help"],
        ["plugins", "--help"],
    ],
    ids=" ".join,
)
def test_help_loads_no_heavy_module(argv):
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=60
    )
    assert "usage: spyglass" in result.stdout
    assert result.stdout.strip().endswith("HEAVY:"), result.stdout[-300:]


def test_plugins_lists_every_plugin_without_loading_torch_or_the_engine():
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, "plugins"], capture_output=True, text=True, timeout=60
    )
    for name in (
        "fcfs",
        "prefix_cache",
        "metrics",
        "tracing",
        "structured_output",
        "draft_model",
        "self_draft",
    ):
        assert f"{name}: " in result.stdout
    assert result.stdout.strip().endswith("HEAVY:"), result.stdout[-300:]


def test_serve_help_lists_its_options():
    result = subprocess.run(
        [sys.executable, "-m", "spyglass.core.cli.main", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    for option in (
        "--port",
        "--dtype",
        "--api-key",
        "--telemetry",
        "--replicas",
        "--metrics-label",
    ):
        assert option in result.stdout


def test_start_up_imports_run_without_collections_and_leave_their_objects_frozen():
    import gc

    from spyglass.core.cli.startup import collector_paused

    before = gc.get_freeze_count()
    try:
        with collector_paused():
            assert not gc.isenabled()
            made = [[] for _ in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + len(made)
    finally:
        gc.unfreeze()
