"""The wheels `gpu_check.py` needs on a lent GPU machine, fetched here into an ignored ``.whl/``.

The device has no network and takes at most 64 MiB of files per call. It has PyTorch, Triton and
transformers (with what they need), pluggy, prometheus-client and psutil (`DEVICE_ROOTS`); the rest
of what Spyglass needs to run, serve and be profiled travels as wheels of the versions installed
here, built for the device's Python:

    python examples/gpu_bundle.py [--python-version 3.12] [--dest .whl]

and then on the device (the ``run`` tool, carrying ``.whl``): ``bash examples/gpu_run.sh``.
"""

import argparse
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

DEVICE_ROOTS = ("torch", "triton", "transformers", "pluggy", "prometheus-client", "psutil")
"""What the lent machine has installed; everything these need is there too."""

BUNDLE_ROOTS = ("spyglass[gpu]", "py-spy")
"""What the check runs: Spyglass (with its GPU extra) and the sampler the serving table may use."""


def platforms(glibc_minor: int) -> list[str]:
    """The wheel tags a Linux x86-64 machine with glibc 2.``glibc_minor`` runs: pip takes each
    older tag only when it is named, the legacy aliases included."""
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc_minor, 4, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


LIMIT_BYTES = 64 * 2**20

LEFT_OUT = {"grpcio": "7 MB, for the OTLP gRPC exporter only, imported when traces go to gRPC"}
"""Needed distributions that stay here, and why: the check never loads them."""


def closure(roots: tuple[str, ...], python_version: str) -> tuple[dict[str, str], set[str]]:
    """The installed distributions ``roots`` need (themselves included), each at its installed
    version, with markers read for Linux on x86-64 and ``python_version``, by canonical name; and
    the names of those needed but not installed here."""
    found: dict[str, str] = {}
    missing: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    pending = [Requirement(root) for root in roots]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        try:
            installed = distribution(name)
        except PackageNotFoundError:
            missing.add(name)
            continue
        found[name] = installed.version
        for line in installed.requires or ():
            needed = Requirement(line)
            extras = {"", *requirement.extras}
            if needed.marker is None or any(
                needed.marker.evaluate(_environment(python_version, extra)) for extra in extras
            ):
                pending.append(needed)
    return found, missing


def _environment(python_version: str, extra: str) -> dict[str, str]:
    """The marker variables of the device's Python, with one of the requirer's extras."""
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "extra": extra,
    }


def bundle(python_version: str) -> tuple[dict[str, str], set[str]]:
    """The distributions to carry, pinned: what the check runs, less what the device has, less
    Spyglass itself (which travels as the checkout) and `LEFT_OUT`; and those it needs that are
    not installed here (optional ones, or what the device's Python needs and this one does not)."""
    carried, missing = closure(BUNDLE_ROOTS, python_version)
    present, _ = closure(DEVICE_ROOTS, python_version)
    pins = {
        name: version
        for name, version in sorted(carried.items())
        if name not in present and name != "spyglass" and name not in LEFT_OUT
    }
    return pins, missing - set(present)


def download(wanted: list[str], python_version: str, glibc_minor: int, dest: Path) -> None:
    """Fetch the ``wanted`` wheels (requirement strings) for the device, without their
    dependencies (the list is the closure)."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    command += ["--only-binary=:all:", "--python-version", python_version]
    command += [option for tag in platforms(glibc_minor) for option in ("--platform", tag)]
    subprocess.run([*command, "--dest", str(dest), *wanted], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-version", default="3.12", help="the device's Python (X.Y)")
    parser.add_argument(
        "--glibc",
        default="2.34",
        help="the device's glibc (gpu_run.sh prints it; llguidance's wheels need 2.31 or newer)",
    )
    parser.add_argument("--dest", default=".whl", type=Path)
    args = parser.parse_args()
    pins, missing = bundle(args.python_version)
    if missing:  # their newest wheels, then
        print(f"needed on Python {args.python_version}, not installed here: {sorted(missing)}")
    wanted = [f"{name}=={version}" for name, version in pins.items()] + sorted(missing)
    download(wanted, args.python_version, int(args.glibc.split(".")[1]), args.dest)
    size = sum(path.stat().st_size for path in args.dest.glob("*.whl"))
    print(f"{len(wanted)} wheels, {size / 2**20:.1f} MiB in {args.dest}: {', '.join(wanted)}")
    if size > LIMIT_BYTES:
        sys.exit(f"over the device's {LIMIT_BYTES // 2**20} MiB with the checkout: trim the list")


if __name__ == "__main__":
    main()
