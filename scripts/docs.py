"""The docs' generated tables, written from the registries they describe: `make docs` (python -m scripts.docs).

    README.md        kinds table     model/kinds.py's ATTENTION_KINDS: what a query computes, the cost, the weights
    docs/DOCTOR.md   verdict table   monitor/units.py's checks and the verdicts each gives
                     bug table       bench/catalogue/bugs.py's planted bugs, the held-out ones included

A table lies between `<!-- NAME: make docs -->` and `<!-- end of NAME -->`; the text around it is written by hand.
`--check` writes nothing and exits 1 naming each file whose tables are stale (tests/test_docs.py compares the same).
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kinds_table() -> str:
    from model.kinds import ATTENTION_KINDS

    lines = ["| kind | what a query i computes | cost | weights handed out |", "|---|---|---|---|"]
    for name, kind in ATTENTION_KINDS.items():
        settings = f" ({kind.doc_settings})" if kind.doc_settings else ""
        lines.append(f"| `{name}`{settings} | {kind.doc_computes} | {kind.doc_cost} | {kind.doc_weights} |")
    return "\n".join(lines)


def verdict_table() -> str:
    import monitor.layer_contract  # noqa: F401  (registers the checks of one layer alone: diagnose.py --attention)
    from monitor.units import verdict_reference_markdown

    return verdict_reference_markdown()


def bug_table() -> str:
    from bench.catalogue.bugs import bug_table_markdown

    return bug_table_markdown()


TABLES = {"README.md": {"kinds table": kinds_table},
          "docs/DOCTOR.md": {"verdict table": verdict_table, "bug table": bug_table}}


def filled(text: str, tables: dict) -> str:
    """`text` with each table made anew between its markers; ValueError naming a table whose markers are missing."""
    for name, make in tables.items():
        start, end = f"<!-- {name}: make docs -->", f"<!-- end of {name} -->"
        if start not in text or end not in text:
            raise ValueError(f"no {start} … {end} block to fill")
        before, rest = text.split(start, 1)
        text = before + start + "\n" + make() + "\n" + end + rest.split(end, 1)[1]
    return text


def stale(root: Path = ROOT, write: bool = False) -> list[str]:
    """The files whose generated tables differ from what the registries give now (rewritten when `write`)."""
    differing = []
    for file, tables in TABLES.items():
        path = root / file
        text = path.read_text(encoding="utf-8")
        new = filled(text, tables)
        if new != text:
            differing.append(file)
            if write:
                path.write_text(new, encoding="utf-8")
    return differing


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.docs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file's tables are stale")
    args = parser.parse_args(argv)
    try:
        differing = stale(write=not args.check)
    except (OSError, ValueError) as e:
        sys.exit(f"error: {e}")
    for file in differing:
        print(f"{file}: {'stale' if args.check else 'rewritten'}")
    return 1 if args.check and differing else 0


if __name__ == "__main__":
    sys.exit(main())
