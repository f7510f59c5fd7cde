"""The walls between packages, as import-linter contracts (pyproject.toml), hold."""

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    command = shutil.which("lint-imports")
    assert command, "pip install import-linter (the test extra)"
    result = subprocess.run(
        [command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_code_is_formatted_and_lint_clean():
    ruff = shutil.which("ruff")
    assert ruff, "pip install ruff (the test extra)"
    lint = subprocess.run(
        [ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    formatted = subprocess.run(
        [ruff, "format", "--check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert formatted.returncode == 0, "run `ruff format .`:\n" + formatted.stdout
