"""``examples/gpu_bundle.py`` carries what the GPU check imports and the lent machine lacks: every
third-party module the package and the check's scripts import comes from a carried wheel or from
the machine, except those of features the check does not use."""

import ast
import importlib.util
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

_ROOT = Path(__file__).parents[2]
_SOURCES = ["core", "plugins", "telemetry", "kernels", "examples/gpu_model"]
_SCRIPTS = [
    "gpu_check.py",
    "gpu_serving.py",
    "gpu_attention.py",
    "gpu_arrivals.py",
    "gpu_report.py",
]


@pytest.fixture(scope="module")
def gpu_bundle():
    spec = importlib.util.spec_from_file_location(
        "gpu_bundle", _ROOT / "examples" / "gpu_bundle.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _imported_modules() -> dict[str, set[str]]:
    """Each third-party top-level module imported anywhere in the sources (lazily too), with the
    files that import it; not the scripts' neighbours, which they import by path."""
    files = [path for folder in _SOURCES for path in (_ROOT / folder).rglob("*.py")]
    files += [_ROOT / "examples" / script for script in _SCRIPTS]
    neighbours = {path.stem for path in files}
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names | neighbours | {"spyglass"}:
                    found.setdefault(top, set()).add(str(path.relative_to(_ROOT)))
    return found


def test_every_import_is_carried_or_on_the_device(gpu_bundle):
    pins, missing = gpu_bundle.bundle("3.12")
    present, _ = gpu_bundle.closure(gpu_bundle.DEVICE_ROOTS, "3.12")
    available = set(pins) | set(present) | set(gpu_bundle.LEFT_OUT) | missing
    distributions = packages_distributions()
    uncovered = {}
    for module, importers in _imported_modules().items():
        names = {canonicalize_name(name) for name in distributions.get(module, [])}
        if not names & available:
            uncovered[module] = importers
    # Ray Serve replicas (`spyglass serve --replicas`), which the check does not start.
    assert uncovered.pop("ray") <= {
        "core/cli/replicas.py",
        "core/replicas/deployments.py",
        "core/replicas/router.py",
    }
    # The NVML bindings are optional (GPU gauges), not installed here: fetched at their newest.
    if "pynvml" in uncovered:
        assert uncovered.pop("pynvml") == {"telemetry/metrics.py"}
        assert "nvidia-ml-py" in missing
    assert uncovered == {}
    assert not set(pins) & set(present)
    assert {"litestar", "uvicorn", "gguf", "llguidance", "av", "opentelemetry-sdk"} <= set(pins)


def test_wheels_are_asked_for_the_devices_glibc_and_every_older_tag(gpu_bundle):
    tags = gpu_bundle.platforms(31)
    assert tags[0] == "manylinux_2_31_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux_2_32_x86_64" not in tags
