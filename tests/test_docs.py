"""The docs hold no pasted facts: their tables are what `make docs` (scripts/docs.py) writes from the registries,
each threshold they quote is the doctor's constant, and they point at code by name, never by line number."""

import re

import pytest

import monitor.verdict_table
from conftest import ROOT
from model.kinds import ATTENTION_KINDS
from scripts.docs import TABLES, filled, kinds_table, stale

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]


def test_the_committed_docs_are_what_make_docs_writes():
    assert stale() == [], "run: make docs"


def test_a_table_edited_by_hand_or_without_its_markers_is_found(tmp_path):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    edited = text.replace("| O(L²) |", "| O(L) |", 1)
    assert edited != text and filled(edited, TABLES["README.md"]) == text
    with pytest.raises(ValueError, match="kinds table: make docs"):
        filled(text.replace("<!-- end of kinds table -->", ""), TABLES["README.md"])


def test_each_kind_describes_itself_in_the_readme_table():
    rows = kinds_table().splitlines()[2:]
    assert len(rows) == len(ATTENTION_KINDS)
    # a kind that forgot its own description inherits full attention's and would read as it
    assert len({kind.doc_computes for kind in ATTENTION_KINDS.values()}) == len(ATTENTION_KINDS)


def test_each_threshold_the_doctor_docs_quote_is_the_constant():
    text = (ROOT / "docs" / "DOCTOR.md").read_text(encoding="utf-8")
    quoted = re.findall(r"\b([A-Z][A-Z_]{3,}) ([0-9][0-9.e-]*)\b", text)
    constants = [(name, value) for name, value in quoted if hasattr(monitor.verdict_table, name)]
    assert len(constants) >= 15  # the tables of "Where the lines are"
    assert [(name, float(value)) for name, value in constants] == [
        (name, float(getattr(monitor.verdict_table, name))) for name, _ in constants]


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_the_docs_point_at_code_by_name_not_by_line(path):
    pasted = re.findall(r"\b[\w/.-]+\.(?:py|md|yaml|sh):\d+", path.read_text(encoding="utf-8"))
    assert pasted == [], f"{path.name}: name the function instead of {pasted}"
