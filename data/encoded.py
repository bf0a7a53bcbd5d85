"""The splits as token ids: each split's ids stored flat (EncodedSplit), made ENCODE_CHUNK texts at a time.

    encoded = encode_splits(tokenizer, splits, max_length)   # {"train": EncodedSplit, "validation": ..., ...}
    ids = encoded["train"][i][0]                             # text i's token ids

The dict of tensors an EncodedSplit holds (state()) is what the data cache stores (data/cache.py); read back
memory-mapped, a split's ids are read from the file as batches need them.
"""

import logging
import mmap
import os
import tempfile

import numpy as np
import torch
from torch.utils.data import Dataset

from data.labels import class_counts, describe_counts, multi_hot
from data.progress import progress_bar
from data.splitting import Splits
from data.tokenizer import PAD_ID, UNK_ID, cut, padding_mask

log = logging.getLogger(__name__)
ENCODE_CHUNK = 10_000  # texts tokenized at a time


class EncodedSplit(Dataset):
    """Token ids of one split, stored flat: text i is ids[offsets[i]:offsets[i + 1]]. Rows a training step attached,
    carried in each item and batch under their names: teacher_probs, a teacher's soft targets (training/teacher.py);
    ngram_logits, the fitted n-gram bag's out-of-fold logits (training/ngram_fit.py)."""

    def __init__(self, ids: torch.Tensor, offsets: torch.Tensor, labels: torch.Tensor,
                 teacher_probs: torch.Tensor | None = None):
        self.ids, self.offsets, self.labels, self.teacher_probs = ids, offsets, labels, teacher_probs
        self.ngram_logits: torch.Tensor | None = None
        self.lengths = (offsets[1:] - offsets[:-1]).tolist()

    @classmethod
    def encode(cls, tokenizer, texts, labels, max_length: int, name: str = "texts") -> "EncodedSplit":
        """Token ids of each text, truncated to max_length tokens; texts are first cut to
        max_length * CHARS_PER_TOKEN_BOUND characters (data.tokenizer.cut), so the tokenizer never sees a huge line
        whole. ENCODE_CHUNK texts at a time: the tokenizer's encodings (tokens, offsets, masks) of a whole split
        would take many times the memory of its ids. The ids go to a scratch file as they come and are read from it
        memory-mapped: a million long texts have a GB of them, never held in memory."""
        lengths = [0]
        progress = progress_bar(len(texts), f"encoding {name}")
        with tempfile.TemporaryFile(prefix="encoded-") as scratch, progress:
            for at in range(0, len(texts), ENCODE_CHUNK):
                chunk = cut(texts[at : at + ENCODE_CHUNK], max_length)
                encoded = [e.ids or [UNK_ID] for e in tokenizer.encode_batch(chunk)]  # only unknown symbols → [UNK]
                lengths += [len(ids) for ids in encoded]
                scratch.write(np.array([i for ids in encoded for i in ids], dtype=np.int32))
                progress.update(len(chunk))
            ids = mapped_ids(scratch)
        return cls(ids, torch.tensor(lengths).cumsum(0), torch.as_tensor(labels))

    def state(self) -> dict:
        """The split's tensors, for the cache: without teacher_probs, which the teacher's own entry keeps."""
        return {"ids": self.ids, "offsets": self.offsets, "labels": self.labels}

    def __len__(self):
        return len(self.labels)

    def attached(self) -> dict[str, torch.Tensor]:
        """The rows attached to this split by name (one row a text), those set."""
        return {name: rows for name, rows in (("teacher_probs", self.teacher_probs),
                                              ("ngram_logits", self.ngram_logits)) if rows is not None}

    def __getitem__(self, i):
        ids, attached = self.ids[self.offsets[i] : self.offsets[i + 1]], self.attached()
        return (ids, self.labels[i], {name: rows[i] for name, rows in attached.items()}) if attached else \
            (ids, self.labels[i])

    def __getitems__(self, rows: list[int]) -> dict[str, torch.Tensor]:
        """A whole batch (torch's DataLoader fetches a batch's rows with this when a dataset has it): what
        data.batches.collate makes of the rows' items, in a few tensor operations instead of a few per text."""
        rows = torch.as_tensor(rows)
        starts = self.offsets[rows]
        lengths = self.offsets[rows + 1] - starts
        mask = padding_mask(lengths)  # (B, L), True at padding
        places = (starts[:, None] + torch.arange(mask.shape[1])).masked_fill_(mask, 0)  # (B, L) into the flat ids
        batch = {"input_ids": self.ids[places].long().masked_fill_(mask, PAD_ID), "padding_mask": mask,
                 "labels": self.labels[rows]}
        return batch | {name: attached[rows] for name, attached in self.attached().items()}


def encode_splits(tokenizer, splits: Splits, max_length: int) -> dict[str, EncodedSplit]:
    """Every split encoded (labels as class ids, or multi-hot rows for several labels a text), logged in one line."""
    n = len(splits.label_names)
    encoded = {
        name: EncodedSplit.encode(tokenizer, texts, multi_hot(splits.labels[name], n) if splits.multi_label
                                  else splits.labels[name], max_length, name)
        for name, texts in splits.texts.items()
    }
    counts = describe_counts(class_counts(encoded["train"].labels, n), splits.label_names) if n else "no labels"
    log.info(
        "encoded %s; vocabulary %d%s", ", ".join(f"{name} {len(s)}" for name, s in encoded.items()),
        tokenizer.get_vocab_size(), f"; labels {splits.label_names} ({'several' if splits.multi_label else 'one'} a "
        f"text; {counts})" if splits.label_names else "",  # pretraining has none
    )
    return encoded


def mapped_ids(file) -> torch.Tensor:
    """The int32 ids written to `file`, memory-mapped (copy-on-write: the tensor may be changed, the file never is);
    the mapping keeps the file's content after the file is closed."""
    file.flush()
    size = file.seek(0, os.SEEK_END)
    if size == 0:  # mmap cannot map an empty file
        return torch.zeros(0, dtype=torch.int32)
    return torch.frombuffer(mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY), dtype=torch.int32)
