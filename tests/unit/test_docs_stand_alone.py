"""The README and docs/ stand alone: nothing points outside the repository, and every local link resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OUTSIDE = ("../shared", "seeds/", "DESIGN.md", "firepool-paper.txt")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_a_doc_names_no_file_outside_the_repository(doc: Path) -> None:
    text = doc.read_text()
    assert [needle for needle in OUTSIDE if needle in text] == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_of_a_doc_is_a_file_of_the_repository(doc: Path) -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text())
    local = [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]
    missing = [t for t in local if not (doc.parent / t).resolve().is_relative_to(ROOT) or not (doc.parent / t).exists()]
    assert missing == []


def test_the_design_doc_cites_the_paper_by_title_and_arxiv_id() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    assert "Brokering Warm GPU Capacity for Agentic and RL" in text and "2611.10832" in text
