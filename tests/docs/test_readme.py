"""The README is a newcomer's first page: short, and every link in it leads somewhere."""

from __future__ import annotations

import re

from tests.docs.helpers import REPO

README = REPO / "README.md"
MAX_LINES = 200
_LOCAL_LINK = re.compile(r"\]\((?!https?://|#)([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_stays_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, (
        f"README.md has {len(lines)} lines, over its limit of {MAX_LINES}: "
        "move the detail into a page under docs/ and link to it"
    )


def test_readme_links_lead_to_files_in_the_repository() -> None:
    missing = [
        target for target in _LOCAL_LINK.findall(README.read_text()) if not (REPO / target).exists()
    ]
    assert missing == [], f"README.md links to files that do not exist: {missing}"


def test_readme_shows_the_two_commands_and_an_install() -> None:
    text = README.read_text()
    for needed in ("make demo", "make test", "helm install", "kind: SDCPolicy"):
        assert needed in text, f"README.md no longer shows {needed!r}"


def test_the_development_page_names_every_test_group_directory() -> None:
    suites = (REPO / "tests" / "run-suites.sh").read_text()
    groups = re.findall(r'\[([A-Z])\]="([^"]+)"', suites)
    page = (REPO / "docs" / "development.md").read_text()
    assert groups, "tests/run-suites.sh defines no group"
    for group, directories in groups:
        for directory in directories.split():
            assert f"`{directory}`" in page, (
                f"docs/development.md does not list {directory} (group {group} of "
                "tests/run-suites.sh)"
            )
