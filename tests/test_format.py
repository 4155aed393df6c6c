"""The tree stays formatted: ``ruff format --check`` with the settings in pyproject.toml."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_tree_is_formatted_by_ruff():
    proc = subprocess.run(
        [sys.executable, '-m', 'ruff', 'format', '--check', 'mmcirc', 'tools', 'tests', 'configs'],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, (
        'run `.venv/bin/ruff format mmcirc tools tests configs`; not formatted:\n' + proc.stdout
    )
