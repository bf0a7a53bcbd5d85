"""The texts of a split as a read-only sequence over an Arrow column: the file's memory-mapped Arrow table (what
`datasets` reads every source into) and the row numbers of the split, so that no split is ever a list of Python
strings.

    texts = TextColumn(dataset.data.column("text"))  # every row of the table
    len(texts), texts[0], texts[10:20]                # a count, one text, a list of texts
    for text in texts: ...                           # read CHUNK rows at a time
    texts.take([3, 1, 4])                            # the texts of these rows: another TextColumn, nothing copied

Numbers in a text column (JSON, parquet) are texts too: 42 reads as "42"; a missing value reads as None.
"""

import operator
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

CHUNK = 10_000  # rows turned into Python strings at a time


class TextColumn(Sequence):
    def __init__(self, column: pa.ChunkedArray | pa.Array | list, rows: np.ndarray | None = None):
        """column: the Arrow column (a list of texts is made one); rows: the row numbers in it, in order (None:
        all of them)."""
        if isinstance(column, list):
            column = pa.array(column, pa.string())
        if isinstance(column, pa.Array):
            column = pa.chunked_array([column])
        self.column, self.rows = column, rows
        # Where each Arrow chunk starts: a row is read from its own chunk, since a take over the whole chunked column
        # would first copy the column into one array.
        self.starts = np.cumsum([0] + [len(chunk) for chunk in column.chunks])

    def __len__(self) -> int:
        return len(self.column) if self.rows is None else len(self.rows)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if self.rows is None and step == 1:  # a slice of the Arrow column itself: nothing to look up
                return as_texts(self.column.slice(start, max(0, stop - start)).to_pylist())
            return self.read(np.arange(start, stop, step) if self.rows is None else self.rows[key])
        position = operator.index(key) + (len(self) if key < 0 else 0)
        if not 0 <= position < len(self):
            raise IndexError(f"text {key} of {len(self)}")
        return self.read(np.array([position if self.rows is None else self.rows[position]]))[0]

    def __iter__(self):
        for at in range(0, len(self), CHUNK):
            yield from self[at : at + CHUNK]

    def take(self, rows) -> "TextColumn":
        """The texts at these positions of this column, in this order."""
        return TextColumn(self.column, self.row_numbers()[np.asarray(rows, dtype=np.int64)])

    def row_numbers(self) -> np.ndarray:
        return np.arange(len(self.column)) if self.rows is None else self.rows

    def read(self, rows: np.ndarray) -> list:
        """The texts at these row numbers of the column, in their order, read Arrow chunk by Arrow chunk."""
        chunk_of = np.searchsorted(self.starts, rows, side="right") - 1
        texts = [None] * len(rows)
        for chunk in np.unique(chunk_of):
            at = np.flatnonzero(chunk_of == chunk)
            values = self.column.chunk(chunk).take(rows[at] - self.starts[chunk]).to_pylist()
            for position, text in zip(at.tolist(), as_texts(values)):
                texts[position] = text
        return texts

    def __repr__(self) -> str:
        return f"TextColumn({len(self)} texts)"


def as_texts(values: list) -> list:
    return [value if isinstance(value, str) or value is None else str(value) for value in values]
