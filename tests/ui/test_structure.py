"""The UI package stays carriable: no module over 500 lines, each doing one job. (No import circles: the import-linter
contract in pyproject.toml, run by `make lint`.)"""

from __future__ import annotations

from pathlib import Path

UI = Path(__file__).resolve().parents[2] / "app" / "ui"
MAX_LINES = 500


def test_every_ui_module_is_under_500_lines() -> None:
    long = {
        path.name: n
        for path in UI.glob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"split these by job: {long}"
