"""Reading one file of texts and labels (CSV, TSV, JSON, JSONL, parquet) through `datasets`: its encoding, its
columns, rows without a text or a label, the labels.txt that names integer labels; and the one rule on empty texts
(`has_text`).

Imports nothing heavy at the top: the faces read has_text here before anything loads pyarrow.
"""

import codecs
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from data import labels
from data.errors import DataError
from data.label_encoding import is_integer, is_missing

if TYPE_CHECKING:  # pyarrow is imported where a file is read
    from data.columns import TextColumn

log = logging.getLogger(__name__)

SUFFIXES = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
LABEL_NAMES_FILE = "labels.txt"  # beside a training file of integer labels: the names, one a line, in index order


def check_utf8(path: Path) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as e:
                raise DataError(f"{path}: not valid UTF-8 (byte {offset + e.start}: {e.reason}); save it as UTF-8") from None
            offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"{path}: not valid UTF-8 (truncated character at the end); save it as UTF-8") from None


def read_table(path: Path, text_column: str, label_column: str | list[str] | None) -> tuple["TextColumn", list | None]:
    """Texts and raw labels (None when label_column is None) of one CSV/TSV/JSON/JSONL/parquet file, read with
    `datasets` into its memory-mapped Arrow cache. A list of label columns is one 0/1 column per label: each row's
    labels are the set of the columns holding 1 (data/labels.py).

    CSV/TSV cells of the two columns are read as the file's own text: pandas would otherwise read a column of
    numbers as numbers ("007" → 7, a text "42" → 42) and the labels "01", "10" as 1 and 10. JSON and parquet keep
    the types the file gives them."""
    import datasets

    from data.columns import TextColumn

    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a file")
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    builder = SUFFIXES.get(path.suffix.lower())
    if builder is None:
        raise DataError(f"{path}: unsupported file type {path.suffix!r} (use {', '.join(SUFFIXES)})")
    if builder != "parquet":
        check_utf8(path)
    if not has_rows(path, builder):  # `datasets` fails on each empty format with a different riddle
        raise DataError(f"{path}: no rows" + (" (a header only, or an empty file)" if builder == "csv" else ""))
    kwargs = {"delimiter": "\t"} if path.suffix.lower() == ".tsv" else {}
    label_columns = [label_column] if isinstance(label_column, str) else list(label_column or [])
    if builder == "csv":
        kwargs["keep_default_na"] = False  # a text "NA" or "null" stays text
        columns = [text_column] + label_columns
        kwargs["converters"] = {column: str for column in columns}  # cells as written, never parsed as numbers
    try:
        table = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
    except Exception as e:  # datasets wraps parser errors several layers deep; report the innermost
        if builder == "json" and (line := first_bad_json_line(path)) is not None:
            raise DataError(f"{path}: {line}") from None
        while e.__cause__ is not None or e.__context__ is not None:
            e = e.__cause__ or e.__context__
        raise DataError(f"{path}: could not be read as {path.suffix} ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    for column in (text_column, *label_columns):
        if column and column not in table.column_names:
            raise DataError(f"{path}: no column {column!r}; columns found: {', '.join(table.column_names)}")
    if table.num_rows == 0:
        raise DataError(f"{path}: no rows")
    check_text_type(path, text_column, table.data.column(text_column).type)
    texts = TextColumn(table.data.column(text_column))
    if isinstance(label_column, str) or not label_columns:
        return texts, table.data.column(label_column).to_pylist() if label_column else None
    try:
        columns = {column: table.data.column(column).to_pylist() for column in label_columns}
        return texts, labels.from_indicator_columns(columns)
    except labels.LabelError as e:
        raise DataError(f"{path}: {e}") from None


def check_text_type(path: Path, column: str, arrow_type) -> None:
    """Texts are strings (numbers read as texts too: data/columns.py); a column of lists, records or bytes would be
    trained on as its Python repr, so it is refused."""
    import pyarrow as pa

    kinds = ((pa.types.is_binary, "binary values"), (pa.types.is_large_binary, "binary values"),
             (pa.types.is_fixed_size_binary, "binary values"), (pa.types.is_list, "lists"),
             (pa.types.is_large_list, "lists"), (pa.types.is_fixed_size_list, "lists"), (pa.types.is_struct, "structs"),
             (pa.types.is_map, "maps"))
    for test, kind in kinds:
        if test(arrow_type):
            raise DataError(f"{path}: text column {column!r} holds {kind} ({arrow_type}), not texts; name the column "
                            "of texts with text_column")


def read_unlabeled(path, text_column: str = "text") -> list[str]:
    """The non-empty texts of an unlabeled file, for pretraining: one text per line of a plain text file (any other
    suffix than the table formats), or per row of a CSV/TSV/JSON/JSONL/parquet file's `text_column`."""
    path = Path(path)
    if path.suffix.lower() in SUFFIXES:
        texts, _ = read_table(path, text_column, None)
    else:
        if path.is_dir():
            raise DataError(f"{path}: is a directory, not a file")
        if not path.is_file():
            raise DataError(f"{path}: file not found")
        check_utf8(path)
        texts = path.read_text(encoding="utf-8").splitlines()
    kept = [text for text in texts if has_text(text)]
    if not kept:
        where = f" in column {text_column!r}" if path.suffix.lower() in SUFFIXES else ""
        raise DataError(f"{path}: no non-empty texts{where}")
    if len(kept) < len(texts):
        log.warning("%s: skipped %d empty or whitespace-only texts of %d", path, len(texts) - len(kept), len(texts))
    return kept


def first_bad_json_line(path: Path) -> str | None:
    """Which line of a JSON-lines file is not JSON, and why; None for a file of JSON lines (or one JSON document).
    Arrow's reader counts rows within the block it was reading, so its row number misleads past the first block."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if number == 1 and line.lstrip().startswith("["):  # one JSON document, not one a line
                return None
            if line.strip():
                try:
                    json.loads(line.rstrip())
                except json.JSONDecodeError as e:
                    return f"line {number} is not valid JSON ({e.msg} at column {e.colno})"
    return None


def has_rows(path: Path, builder: str) -> bool:
    """Whether the file holds anything past a CSV header (or, for JSON, past an empty list)."""
    if builder == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows > 0
        except Exception:  # not parquet at all: `datasets` reports it
            return True
    with open(path, encoding="utf-8") as f:
        if builder == "csv":
            f.readline()
        rest = f.read(1 << 16).strip()
        while rest == "" and (chunk := f.read(1 << 20)):  # blank lines, however many
            rest = chunk.strip()
    return "".join(rest.split()) not in ("", "[]")


def drop_unusable(texts: "TextColumn", labels: list, where: str) -> tuple["TextColumn", list]:
    """Rows without a text (empty, whitespace-only or missing) or without a label (an empty cell or a missing
    value) give nothing to learn from or score against: they are skipped, with a warning that counts each kind.
    Numbers in a text column (JSON, parquet) are texts too: 42 becomes "42". Text labels lose surrounding
    whitespace (strip_labels)."""
    readable = [has_text(text) for text in texts]  # read a chunk at a time
    keep = [i for i, label in enumerate(labels) if readable[i] and not is_missing(label)]
    if not all(readable):
        log.warning("%s: skipped %d empty or whitespace-only texts of %d", where, readable.count(False), len(texts))
    if sum(readable) > len(keep):
        unlabelled = sum(readable) - len(keep)
        log.warning("%s: skipped %d rows with an empty or missing label of %d", where, unlabelled, len(texts))
    if not any(readable):
        raise DataError(f"{where}: no non-empty texts")
    if not keep:
        raise DataError(f"{where}: no row has a label")
    return texts.take(keep), strip_labels([labels[i] for i in keep], where)


def strip_labels(labels: list, where: str) -> list:
    """Text labels without surrounding whitespace: "pos", " pos " and "pos " are one class, not three (a CSV
    written with spaces after the commas). How many were changed goes to a warning."""
    stripped = [label.strip() if isinstance(label, str) else label for label in labels]
    changed = [(a, b) for a, b in zip(labels, stripped) if a != b]
    if changed:
        log.warning("%s: removed the spaces around %d of %d labels (e.g. %r → %r)", where, len(changed), len(labels),
                    *changed[0])
    return stripped


def has_text(text: str | None) -> bool:
    """The one rule on empty texts: missing, empty or whitespace-only is no text to learn from or classify (the
    data skip it, predict.py and serve.py answer it with an error, the head tools and benches leave it out)."""
    return text is not None and text.strip() != ""


def integer_label_names(train_labels: list, names_file: str | None, train_file: Path | None) -> list[str] | None:
    """The names of integer labels (or lists of them): read from `names_file` (data.label_names_file) or, when none
    is given, from a labels.txt beside the training file (the hub's layout: one name a line, in index order); None
    when the labels are not integers or there is no such file. Every label must index a line."""
    values = [v for label in train_labels for v in (label if labels.is_set(label) else [label])]
    integers = bool(values) and all(is_integer(v) for v in values)
    if names_file is None:
        beside = train_file.parent / LABEL_NAMES_FILE if train_file is not None else None
        if not integers or beside is None or not beside.is_file():
            return None
        path = beside
    else:
        path = Path(names_file)
        if not integers:
            example = next(v for v in values if not is_integer(v)) if values else None
            raise DataError(f"data.label_names_file {names_file}: the labels are not integers indexing its lines "
                            f"(such as {example!r}); leave label_names_file unset")
    if not path.is_file():
        raise DataError(f"{path}: file not found (data.label_names_file)")
    check_utf8(path)
    names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise DataError(f"{path}: label name {repeated[0]!r} on more than one line; one name a line, each once")
    largest = max(int(v) for v in values)
    if min(int(v) for v in values) < 0 or largest >= len(names):
        raise DataError(f"{path}: {len(names)} label names, but the training labels go up to {largest} (from 0, one "
                        "name a line)" + ("" if names_file else "; give the right data.label_names_file or move it"))
    log.info("label names: the %d lines of %s (the integer labels index them)", len(names), path)
    return names
