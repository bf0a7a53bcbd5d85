"""The pretraining DataModule: unlabeled text → a tokenizer built from it → batches of token ids.

The pretraining text is the training split's own texts (the same split `train.py fit` makes from the same data
settings), plus the texts of any unlabeled files named in `unlabeled_files`. Never validation or test texts: an
unlabeled text equal to one of them is dropped (and counted in the log). A small share of the pretraining text is
held out (`holdout_fraction`) to score the objective on text it never trained on: that is the "validation" split
here, and where the attention monitor draws its probes from.

Batches are those of TextDataModule (input_ids, padding_mask, and labels that are all 0: there are none).
"""

import logging
import random

import torch

from data.datamodule import TextDataModule
from data.encoded import EncodedSplit, encode_splits
from data.reading import read_unlabeled
from data.sources import DataError
from data.splitting import Splits
from data.tokenizer import UNK_ID

log = logging.getLogger(__name__)
MIN_TOKENS = 2  # a text of one token has nothing left to read once that token is masked
MAX_HOLDOUT = 2000  # held-out texts scored each validation pass: enough for a steady figure, cheap on a CPU
# Fine-tuning with a pretraining checkpoint's tokenizer: the share of the training tokens that are [UNK] to it, above
# which the run is refused (the network would read mostly one token: the tokenizer was made for other text, say
# English for Chinese reviews), and above which it is warned about (a fresh tokenizer leaves well under 1% unknown).
UNKNOWN_REFUSED, UNKNOWN_WARNED = 0.5, 0.1


class PretrainDataModule(TextDataModule):
    def __init__(
        self,
        unlabeled_files: list[str] | None = None,
        unlabeled_column: str = "text",
        holdout_fraction: float = 0.02,
        **data,
    ):
        """
        Args:
            unlabeled_files: more pretraining text: CSV/TSV/JSON/JSONL/parquet files (column `unlabeled_column`),
                or plain text files with one text per line.
            unlabeled_column: the text column of the unlabeled table files.
            holdout_fraction: share of the pretraining text held out to score the objective (at most 2,000 texts).
            **data: the data settings of `train.py fit` (its `data:` section, listed below), with the fine-tuning
                run's values: the labelled data's training split is pretraining text, its validation and test
                splits never are; the tokenizer (max_length, vocab_size, tokenizer, split_cjk, split_punctuation)
                is built from the pretraining text, and fine-tuning with --model.init_from uses it as it is. No
                teacher (there are no labels to distil) and no tokenizer_from.
        """
        super().__init__(teacher=None, tokenizer_from=None, **data)
        if not 0.0 < holdout_fraction < 1.0:
            raise DataError(f"holdout_fraction must be between 0 and 1 (exclusive), got {holdout_fraction}")
        # TextDataModule saved its own arguments; these are the whole set (the cache key is made from them).
        self.save_hyperparameters()

    def cache_path(self, **chosen):
        path = super().cache_path(**chosen)
        return path.with_name("pretrain-" + path.name)

    def pretraining_texts(self) -> tuple[list[str], dict[str, int]]:
        """The training split's texts and the unlabeled files' texts, without any validation or test text; and how
        many texts each source gave."""
        splits = self.read_splits()
        texts, counts = list(splits.texts["train"]), {splits.sources.get("train", "train"): len(splits.texts["train"])}
        held_out = {text.strip() for name in ("validation", "test") for text in splits.texts.get(name, [])}
        for path in self.hparams.unlabeled_files or []:
            unlabeled = read_unlabeled(path, self.hparams.unlabeled_column)
            kept = [text for text in unlabeled if text.strip() not in held_out]
            if len(kept) < len(unlabeled):
                log.warning("%s: dropped %d texts that are validation or test texts of the labelled data",
                            path, len(unlabeled) - len(kept))
            if not kept:
                raise DataError(f"{path}: every text is a validation or test text of the labelled data; "
                                "nothing is left to pretrain on")
            texts += kept
            counts[str(path)] = len(kept)
        return texts, counts

    def _build(self) -> dict:
        hp = self.hparams
        texts, counts = self.pretraining_texts()
        order = list(range(len(texts)))
        random.Random(hp.seed).shuffle(order)
        n_held = min(MAX_HOLDOUT, max(1, round(hp.holdout_fraction * len(texts))))
        if len(texts) < 2:
            raise DataError(f"{', '.join(counts)}: {len(texts)} pretraining text(s); at least 2 are needed "
                            "(one to learn from, one to score on)")
        parts = {"train": [texts[i] for i in order[n_held:]], "validation": [texts[i] for i in order[:n_held]]}
        splits = Splits(parts, {name: [0] * len(part) for name, part in parts.items()}, [],
                        {"train": " + ".join(counts), "validation": "held-out pretraining text"})
        tokenizer, sizes = self._tokenizer_for(splits)
        encoded = encode_splits(tokenizer, splits, sizes["max_length"])
        for name in ("train", "validation"):
            encoded[name] = maskable(encoded[name], f"{splits.sources['train']} ({name})")
        log.info("pretraining text: %s", ", ".join(f"{source} {n}" for source, n in counts.items()))
        return {"tokenizer": tokenizer.to_str(), "label_names": [], "multi_label": False, "splits": encoded, **sizes}


def maskable(split: EncodedSplit, where: str) -> EncodedSplit:
    """The texts with at least MIN_TOKENS tokens; DataError when none has."""
    keep = [i for i, n in enumerate(split.lengths) if n >= MIN_TOKENS]
    if not keep:
        longest = max(split.lengths, default=0)
        raise DataError(f"{where}: texts too short to mask: the longest has {longest} token(s), pretraining needs "
                        f"at least {MIN_TOKENS} (one to mask, one to read)")
    if len(keep) == len(split):
        return split
    log.warning("%s: skipped %d texts of fewer than %d tokens", where, len(split) - len(keep), MIN_TOKENS)
    pieces = [split.ids[split.offsets[i] : split.offsets[i + 1]] for i in keep]
    offsets = torch.tensor([0] + [len(piece) for piece in pieces]).cumsum(0)
    return EncodedSplit(torch.cat(pieces), offsets, split.labels[keep])


def check_known(split: EncodedSplit, tokenizer_from: str) -> float:
    """The share of the training split's tokens that are [UNK] to the tokenizer of the pretraining checkpoint
    `tokenizer_from` (the split encoded with it); DataError above UNKNOWN_REFUSED, a warning above UNKNOWN_WARNED,
    so it is said before the training starts, not after an hour of it."""
    share = float((split.ids == UNK_ID).sum()) / max(1, len(split.ids))
    what = (f"{100 * share:.0f}% of the training tokens are [UNK] to the tokenizer of the pretraining checkpoint "
            f"{tokenizer_from} (model.init_from)")
    if share > UNKNOWN_REFUSED:
        raise DataError(f"{what}: it was made from other text (another language?); pretrain on text like these "
                        "(train.py pretrain with these data), or fine-tune without model.init_from")
    if share > UNKNOWN_WARNED:
        log.warning("%s: the network cannot tell those words apart", what)
    return share
