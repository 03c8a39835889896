"""The README and the docs link to files that exist: a moved screen or page shows as a broken image or link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # [text](target) and ![alt](target), without the #anchor


def relative_links(page: Path) -> list[str]:
    return [target for target in LINK.findall(page.read_text(encoding="utf-8")) if "://" not in target]


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_relative_link_names_a_file_that_exists(page: Path) -> None:
    missing = [target for target in relative_links(page) if not (page.parent / target).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_the_readme_shows_a_screen_of_the_window() -> None:
    images = [target for target in relative_links(ROOT / "README.md") if target.endswith(".png")]
    assert images and all(target.startswith("docs/screens/") for target in images)
