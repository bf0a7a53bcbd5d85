"""The DataModule: load splits → train the tokenizer on train → encode once (cached) → length-bucketed batches.

A batch is a dict: input_ids (B, L) long, padding_mask (B, L) bool with True at padding (from the texts' lengths,
data.tokenizer.pad), labels (B,) long (several labels a text: (B, C) float, 1 where a label applies), padded per batch to its longest text; with data.teacher, training batches
also hold teacher_probs (B, C).
"""

import ctypes
import hashlib
import json
import logging
import mmap
import os
import math
import random
import tempfile
from pathlib import Path

import lightning as L
import numpy as np
import torch
from filelock import FileLock
from torch.utils.data import DataLoader, Dataset, Sampler

from data.checkpoint import read_pretraining_checkpoint
from data.files import WriteError, describe, write_atomically
from data.labels import class_counts, describe_counts, is_imbalanced, multi_hot
from data.sources import LABEL_NAMES_FILE, DataError, Splits, load_splits, local_copy_dir
from data.progress import progress_bar
from data.teacher import out_of_fold_probabilities
from data.tokenizer import (FIRST_WORD_ID, KINDS, SPECIAL_TOKENS, UNK_ID, CutTexts, cut, load_tokenizer, pad,
                            stored_form, train_tokenizer, word_counts)

log = logging.getLogger(__name__)
NO_TEST_SPLIT = ("no test split (SST-2's test labels are not public: its held-out figure is `validate`): give "
                 "data.test_file, or use a dataset with a labelled test split")
CACHE_VERSION = 7  # part of the cache key: bump it when tokenization, the splits or the teacher's output change
# 7: the several-labels teacher answers a label on every fitted text with 1 (it gave 0), or on none with 0.
# 6: the multi-label teacher's fits changed (liblinear, one process a label) without a bump; the teacher hashes its
#    n-grams on samples over data.teacher.EXACT_CHARS characters (none of the shipped datasets); on imbalanced
#    classes its out-of-fold probabilities get class-balanced offsets (data.teacher.balanced_out_of_fold).

# Adaptive sizes (data.max_length / data.vocab_size left unset), chosen from the training split alone:
LENGTH_PERCENTILE = 100  # max_length covers the longest training text (batches are padded only to their longest
MAX_LENGTH_CAP = 256      # text, so the tail is cheap; SST-2's validation sentences are longer than most training
                         # phrases), at most this unless max_length_caps says otherwise (train.py passes the
                         # network's caps, model.config.max_length_caps: full attention costs L²)
LONG_TEXT_SHARE = 0.2   # with two caps (attention "auto"): the second when more than this share of the training
                        # texts is longer than the first (IMDB 41%; ChnSentiCorp 10%, SST-2 0%)
SHORT_BUCKET_POOL, LONG_BUCKET_POOL = 1, 50  # bucket_pool unset: random batches for short texts, length-sorted
                        # pools for long ones, where padding a batch to its longest text would dominate the cost
VOCAB_SIZE_CAP = 32000  # vocab_size unset: the training words seen twice or more, at most this many (the most
RARE_WORD_SHARE = 0.05  # frequent); those seen once too where they are more than this share of the text: small data,
                        # where [UNK] would replace them in numbers (1,000 SST-2 phrases: 20% of the words; keeping
                        # them: +3.4 points), not rare names and typos (ChnSentiCorp 0.15%, SST-2 0.06%, IMDB 0.4%;
                        # docs/RESULTS.md "Small data", words seen once)
# Upper bounds on the settings that size memory (model/config.py bounds the network the same way):
MAX_BATCH_SIZE = 65536
MAX_VOCAB_SIZE = 1_048_576
MAX_WORKERS = 64  # DataLoader processes (or the CPU count, if larger)
ENCODE_CHUNK = 10_000  # texts tokenized at a time


class EncodedSplit(Dataset):
    """Token ids of one split, stored flat: text i is ids[offsets[i]:offsets[i + 1]]."""

    def __init__(self, ids: torch.Tensor, offsets: torch.Tensor, labels: torch.Tensor,
                 teacher_probs: torch.Tensor | None = None):
        self.ids, self.offsets, self.labels, self.teacher_probs = ids, offsets, labels, teacher_probs
        self.lengths = (offsets[1:] - offsets[:-1]).tolist()

    @classmethod
    def encode(cls, tokenizer, texts, labels: list[int], max_length: int, name: str = "texts") -> "EncodedSplit":
        """Token ids of each text, truncated to max_length tokens; texts are first cut to
        max_length * CHARS_PER_TOKEN_BOUND characters (see there), so the tokenizer never sees a huge line whole.
        ENCODE_CHUNK texts at a time: the tokenizer's encodings (tokens, offsets, masks) of a whole split would take
        many times the memory of its ids. The ids go to a scratch file as they come and are read from it
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
        state = {"ids": self.ids, "offsets": self.offsets, "labels": self.labels}
        return state if self.teacher_probs is None else state | {"teacher_probs": self.teacher_probs}

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        ids = self.ids[self.offsets[i] : self.offsets[i + 1]]
        return (ids, self.labels[i]) if self.teacher_probs is None else (ids, self.labels[i], self.teacher_probs[i])


def mapped_ids(file) -> torch.Tensor:
    """The int32 ids written to `file`, memory-mapped (copy-on-write: the tensor may be changed, the file never is);
    the mapping keeps the file's content after the file is closed."""
    file.flush()
    size = file.seek(0, os.SEEK_END)
    if size == 0:  # mmap cannot map an empty file
        return torch.zeros(0, dtype=torch.int32)
    return torch.frombuffer(mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY), dtype=torch.int32)


def balanced_draws(labels: torch.Tensor, num_classes: int) -> list[float]:
    """Each text's weight in BucketBatchSampler's draws, 1 / (texts of its class): every class is drawn as often,
    the texts of a class equally often (the balanced sampler, data.balanced_sampler)."""
    counts = class_counts(labels, num_classes)
    return (1.0 / counts[labels.long()]).tolist()


def collate(items) -> dict[str, torch.Tensor]:
    """(ids, label[, teacher_probs]) items → a batch padded to its longest text; padding_mask from the lengths
    (data.tokenizer.pad), as prediction builds it."""
    input_ids, padding_mask = pad([item[0] for item in items])
    batch = {"input_ids": input_ids, "padding_mask": padding_mask, "labels": torch.stack([item[1] for item in items])}
    if len(items[0]) == 3:  # the training split with data.teacher
        batch["teacher_probs"] = torch.stack([item[2] for item in items])
    return batch


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of similar length, so little compute goes to padding: shuffle, sort within pools of 50 batches,
    cut into batches, shuffle the batches. With several processes, each takes every world_size-th batch.
    With `weights` (one per text, shuffle only), an epoch is as many texts drawn with replacement in proportion to
    them instead of each text once: balanced_draws gives every class the same share of the batches.
    Each epoch's order is drawn from seed + epoch: the trainer's epoch when `epoch_of` is given (a resumed run, and
    every process, draw the same), else a count of the passes begun."""

    def __init__(self, lengths, batch_size, shuffle, seed=0, rank=0, world_size=1, pool_batches=50, weights=None,
                 epoch_of=None):
        self.lengths, self.batch_size, self.shuffle, self.seed = lengths, batch_size, shuffle, seed
        self.rank, self.world_size, self.pool = rank, world_size, pool_batches * batch_size
        self.weights = weights if shuffle else None
        self.epoch, self.epoch_of = 0, epoch_of

    def batches(self) -> list[list[int]]:
        rng = random.Random(self.seed + self.epoch)
        order = list(range(len(self.lengths)))
        if self.weights is not None:
            order = rng.choices(order, weights=self.weights, k=len(order))
        elif self.shuffle:
            rng.shuffle(order)
        batches = []
        for start in range(0, len(order), self.pool):
            pool = sorted(order[start : start + self.pool], key=self.lengths.__getitem__)
            batches += [pool[i : i + self.batch_size] for i in range(0, len(pool), self.batch_size)]
        if self.shuffle:
            rng.shuffle(batches)
            batches = batches[: len(batches) // self.world_size * self.world_size]  # equal steps on every rank
        return batches[self.rank :: self.world_size]

    def __iter__(self):
        # Counted when a pass begins: Lightning stops reading after len(self) batches, so code after the last
        # yield would never run (every epoch would repeat the first one's order).
        if self.epoch_of is not None:
            self.epoch = self.epoch_of()
        batches = self.batches()
        self.epoch += 1
        yield from batches

    def __len__(self):
        n = -(-len(self.lengths) // self.batch_size)
        return n // self.world_size if self.shuffle else len(range(self.rank, n, self.world_size))


class TextDataModule(L.LightningDataModule):
    def __init__(
        self,
        dataset: str = "sst2",
        data_dir: str | None = None,
        train_file: str | None = None,
        val_file: str | None = None,
        test_file: str | None = None,
        text_column: str | None = None,
        label_column: str | list[str] | None = None,
        label_separator: str | None = None,
        label_names_file: str | None = None,
        val_fraction: float = 0.1,
        max_length: int | None = None,
        batch_size: int = 64,
        vocab_size: int | None = None,
        tokenizer: str = "wordpiece",
        split_cjk: bool = True,
        split_punctuation: bool = True,
        bucket_pool: int | None = 50,
        balanced_sampler: bool = False,
        num_workers: int = 0,
        seed: int = 0,
        cache_dir: str = ".cache",
        teacher: str | None = None,
        tokenizer_from: str | None = None,
        max_length_caps: list[int] | None = None,
    ):
        """
        Args:
            dataset: a registered name (sst2, chnsenticorp_htl, ag_news, imdb, synthetic); ignored when train_file is set.
            data_dir: a local copy of the registered dataset (train.tsv/validation.tsv, all.csv, ...). Without it,
                $ATTENTION_DATA_ROOT/<dataset> is used if it exists, else the Hugging Face hub.
            train_file: your own CSV/TSV/JSON/JSONL/parquet file; replaces `dataset`.
            val_file: validation file for train_file; without it a stratified `val_fraction` of train is held out.
            test_file: optional test file.
            text_column: column holding the text (default: the dataset's, or "text" for own files).
            label_column: column holding the label, strings or integers (default: the dataset's, or "label"); a
                column of lists (parquet/JSON) gives several labels a text; a list of columns, one 0/1 column per
                label ([anger, fear, joy]), too (docs/LABELS.md).
            label_separator: several labels a text in one text column, cut at this string ("," for "anger,fear").
            label_names_file: the names of integer labels (or lists of them), one a line in index order. Unset: a
                labels.txt beside train_file, when there is one (the hub's layout); else the integers are the names.
            val_fraction: share of train held out for validation when there is no validation split (0 < f < 1).
            max_length: longer texts are truncated to this many tokens. Unset: the longest training text in
                tokens, rounded up to a multiple of 8, at most max_length_caps (logged at start and written into
                the run's config.yaml).
            batch_size: texts per batch; batches are bucketed by length and padded per batch.
            vocab_size: most tokens the tokenizer trained on the training split may have (fewer if the text has fewer).
                Unset: the words (split as the tokenizer splits them) seen at least twice in the training split,
                and those seen once too where they are more than 5% of its words (small data), plus [PAD] and
                [UNK], at most 32,000, the most frequent (logged, and written into config.yaml).
            tokenizer: "wordpiece" (sub-words, the default) or "word" (whole words).
            split_cjk: one token per Chinese/Japanese/Korean character (True), or learned multi-character pieces
                (False, wordpiece only): CJK text has no spaces, so a run of characters is one "word" to split.
            split_punctuation: split at punctuation as well as whitespace (True), or at whitespace only (False:
                for text that is already tokenized, such as SST-2's "does n't").
            bucket_pool: training texts are sorted by length within pools of this many batches, so a batch holds
                texts of similar length (little padding); 1 = plain random batches. Unset (null): 1 when
                max_length is at most 256 tokens, 50 beyond (written into the run's config.yaml).
            balanced_sampler: draw the training batches so that every class fills the same share of them (each
                epoch as many texts as the training split, drawn with replacement, a rare class's texts several
                times); one label a text only. The classes are then balanced already, so model.class_weights auto
                leaves the loss unweighted. Off by default: on imbalanced SST-2 balanced class weights did better
                (docs/LABELS.md).
            num_workers: DataLoader worker processes.
            seed: seeds the validation split and the batch order.
            cache_dir: where encoded splits are cached, so a second run starts fast.
            teacher: "ngram" = give each training text the class probabilities of a TF-IDF n-gram + logistic
                regression teacher (out of fold: data/teacher.py; needs scikit-learn), for model.distillation.
                None = no teacher.
            tokenizer_from: a pretraining checkpoint (`train.py pretrain`) whose tokenizer, vocab_size and
                max_length are used instead of training a tokenizer here; train.py sets it from model.init_from.
            max_length_caps: how long an unset max_length may be: at most the first cap; with a second, at most
                the second when more than 20% of the training texts are longer than the first. Unset: [256].
                train.py sets it from model.network.attention: [256] for full attention, [2048] for the cheaper
                kinds, [256, 2048] for "auto" (model.config.max_length_caps).
        """
        super().__init__()
        if not 0.0 < val_fraction < 1.0:
            raise DataError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
        if max_length_caps is not None and (not 1 <= len(max_length_caps) <= 2 or min(max_length_caps) < 1
                                            or list(max_length_caps) != sorted(max_length_caps)):
            raise DataError(f"data.max_length_caps must be one length >= 1, or two rising, got {max_length_caps}")
        if bucket_pool is not None and bucket_pool < 1:
            raise DataError(f"bucket_pool must be >= 1 (or null: chosen from max_length), got {bucket_pool}")
        if teacher not in (None, "ngram"):
            raise DataError(f"teacher must be ngram or null, got {teacher!r}")
        if tokenizer not in KINDS:
            raise DataError(f"tokenizer must be one of {', '.join(KINDS)}, got {tokenizer!r}")
        if (max_length is not None and max_length < 1) or batch_size < 1 or (vocab_size is not None and vocab_size <= FIRST_WORD_ID):
            raise DataError(f"max_length, batch_size must be >= 1 and vocab_size >= {FIRST_WORD_ID + 1}, got {max_length}, "
                            f"{batch_size}, {vocab_size}")
        for name, value, most in (("batch_size", batch_size, MAX_BATCH_SIZE),
                                  ("vocab_size", vocab_size, MAX_VOCAB_SIZE)):
            if value is not None and value > most:  # sizes memory: refused before anything is read
                raise DataError(f"data.{name} {value} is larger than {most}")
        most_workers = max(MAX_WORKERS, os.cpu_count() or 1)
        if not 0 <= num_workers <= most_workers:  # each worker is a process holding its own copy of the dataset
            raise DataError(f"data.num_workers must be in 0..{most_workers}, got {num_workers}")
        self.save_hyperparameters()
        self._state = None  # {"tokenizer": json, "label_names": [...], "splits": {name: EncodedSplit}}
        self._tokenizer = None

    # Sizes the model needs, linked by train.py on instantiation; reading them builds (or loads) the data.
    @property
    def label_names(self) -> list[str]:
        return self.state["label_names"]

    @property
    def multi_label(self) -> bool:
        """Several labels a text (a sigmoid per label), or one (a softmax over the classes)."""
        return self.state.get("multi_label", False)

    @property
    def imbalanced(self) -> bool:
        """Whether accuracy says little on these data (data/labels.py is_imbalanced): macro-F1 is monitored then."""
        train = self.split("train").labels
        return is_imbalanced(class_counts(train, len(self.label_names)), self.multi_label)

    @property
    def balanced_sampler(self) -> bool:
        """data.balanced_sampler, checked against the labels."""
        if self.hparams.balanced_sampler and self.multi_label:
            raise DataError("data.balanced_sampler needs one label a text (several labels a text: thresholds fitted on "
                            "validation and model.class_weights instead)")
        return self.hparams.balanced_sampler

    @property
    def max_length(self) -> int:
        """data.max_length, or the one chosen from the training texts when it was left unset."""
        return self.hparams.max_length or self.state["max_length"]

    @property
    def vocab_size(self) -> int:
        """data.vocab_size, or the one chosen from the training texts when it was left unset."""
        return self.hparams.vocab_size or self.state["vocab_size"]

    @property
    def bucket_pool(self) -> int:
        """data.bucket_pool, or chosen from max_length when it was left unset."""
        if self.hparams.bucket_pool is not None:
            return self.hparams.bucket_pool
        return SHORT_BUCKET_POOL if self.max_length <= MAX_LENGTH_CAP else LONG_BUCKET_POOL

    @property
    def tokenizer(self):
        self.state  # noqa: B018  (built together with the data)
        return self._tokenizer

    @property
    def state(self) -> dict:
        if self._state is None:
            self._record_local_copy()
            self._files_read = [[str(Path(f).resolve()), *_stat(f)] for f in self.data_files()]
            self._state = self._load_or_build()
            return_freed_memory()
            self._tokenizer = load_tokenizer(self._state["tokenizer"])
            for choice in self._state.get("choices", []):  # adaptive sizes, once per process (also from the cache)
                log.info("%s", choice)
        return self._state

    def _record_local_copy(self) -> None:
        """data_dir: the local copy read ($ATTENTION_DATA_ROOT/<dataset> when none was given), so the checkpoint and
        config.yaml name the data of the run and the commands after it (diagnose.py, prune.py, validate) read them
        without the variable."""
        hp = self.hparams
        if hp.data_dir is None and not hp.train_file and hp.dataset != "synthetic":
            folder = local_copy_dir(hp.dataset, None)
            if folder is not None:
                hp.data_dir = str(folder.resolve())

    def split(self, name: str) -> EncodedSplit:
        return self.state["splits"][name]

    def cache_path(self, **chosen) -> Path:
        """The cache file of these settings; `chosen`: sizes to key it by in place of the unset ones."""
        hp = dict(self.hparams) | chosen
        for key in ("batch_size", "num_workers", "cache_dir", "bucket_pool", "balanced_sampler"):
            hp.pop(key)  # they do not change what is encoded
        if hp.get("max_length") is not None:
            hp.pop("max_length_caps", None)  # they only decide an unset max_length
        # Files are identified by path, size and modification time: an edited file is encoded again.
        hp["files"] = [(str(Path(f).resolve()), *_stat(f)) for f in self.data_files() + self._extra_files()]
        hp["version"] = CACHE_VERSION
        key = hashlib.sha256(json.dumps(hp, sort_keys=True).encode()).hexdigest()[:16]
        name = Path(hp["train_file"]).stem if hp["train_file"] else hp["dataset"]
        return Path(self.hparams.cache_dir) / f"{name}-{key}.pt"

    def data_files(self) -> list[str]:
        """The files the data are read from: train/val/test files, or every file of the local copy."""
        hp = self.hparams
        files = [hp[k] for k in ("train_file", "val_file", "test_file") if hp[k]]
        folder = local_copy_dir(hp.dataset, hp.data_dir) if not files and hp.dataset != "synthetic" else None
        return sorted(str(p) for p in folder.iterdir() if p.is_file()) if folder is not None else files

    def files_read(self) -> list[list]:
        """[path, size, modification time] of each data file as it was read, for the checkpoint (diagnose.py notes a
        file changed since training)."""
        self.state  # noqa: B018  (the stamps are taken when the data are read)
        return self._files_read

    def _extra_files(self) -> list[str]:
        """Files besides the data's own whose change must encode the data again."""
        hp = self.hparams
        names = hp.get("label_names_file") or (hp.train_file and Path(hp.train_file).parent / LABEL_NAMES_FILE)
        return ([hp.tokenizer_from] if hp.get("tokenizer_from") else []) + \
            ([str(names)] if names and (hp.get("label_names_file") or Path(names).is_file()) else [])

    def _load_or_build(self) -> dict:
        """The encoded data from the cache, or built and cached. One lock file per cache file (`<name>.lock`
        beside it, left in place: removing it would race with a process about to lock it): with several processes
        (DDP) the first builds, the others wait and load; runs on other data or settings do not wait. A cache folder
        that cannot be written is not an error: the data are encoded in memory, with a warning (tokenizer training is
        deterministic, so every process gets the same)."""
        path = self.cache_path()
        lock = FileLock(path.with_suffix(".lock"))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except OSError as e:
            log.warning("cache_dir %s cannot be written (%s): encoding without a cache", path.parent, e.strerror)
            return self._load(path) or self._build()
        try:
            state = self._load(path)
            if state is None:
                state = self._build()
                if self._save(state, path):
                    state = self._load(path) or state  # memory-mapped: the built copy is freed
            self._link_chosen_sizes(path, state)
            return state
        finally:
            lock.release()

    def _link_chosen_sizes(self, path: Path, state: dict) -> None:
        """The same cache also under the key of the sizes it chose: the run's config.yaml states them, so
        `train.py test --config <run>/config.yaml` finds these data (and the teacher's answers) instead of
        encoding them and fitting the teacher again. A hard link: no second copy on disk."""
        hp = self.hparams
        if hp.max_length is not None and hp.vocab_size is not None or not path.exists():
            return
        alias = self.cache_path(max_length=state["max_length"], vocab_size=state["vocab_size"])
        try:
            if not alias.exists():
                os.link(path, alias)
        except OSError as e:  # a filesystem without hard links: the next run with the sizes encodes again
            log.debug("cache %s not linked as %s: %s", path, alias, e)

    def _load(self, path: Path) -> dict | None:
        if not path.exists():
            return None
        try:
            # Memory-mapped: the ids are read from the file as batches need them, and processes on one machine (DDP
            # ranks, DataLoader workers) share one copy in the page cache instead of holding one each.
            cached = torch.load(path, weights_only=True, mmap=True)
            splits = {name: EncodedSplit(**s) for name, s in cached["splits"].items()}
        except Exception as e:
            log.warning("%s: unreadable cache (%s); encoding again", path, describe(e))
            return None
        log.info("loaded encoded data from %s", path)
        return {**cached, "splits": splits}

    def _save(self, state: dict, path: Path) -> bool:
        """Whether the cache was written."""
        cached = {**state, "splits": {name: s.state() for name, s in state["splits"].items()}}
        try:
            write_atomically(path, lambda temporary: torch.save(cached, temporary), "cache")
            return True
        except WriteError as e:  # a full disk or a read-only folder
            log.warning("%s; the data stay in memory only", e)
            return False

    def _read_splits(self) -> Splits:
        hp = self.hparams
        return load_splits(
            dataset=hp.dataset, data_dir=hp.data_dir, train_file=hp.train_file, val_file=hp.val_file,
            test_file=hp.test_file, text_column=hp.text_column, label_column=hp.label_column,
            val_fraction=hp.val_fraction, seed=hp.seed, label_separator=hp.get("label_separator"),
            label_names_file=hp.get("label_names_file"),
        )

    def _encode(self, tokenizer, splits: Splits, max_length: int) -> dict:
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
        return {"tokenizer": tokenizer.to_str(), "label_names": splits.label_names, "splits": encoded,
                "multi_label": splits.multi_label}

    def _build(self) -> dict:
        hp = self.hparams
        splits = self._read_splits()
        if hp.tokenizer_from:
            tokenizer, vocab_size, max_length, choices = self._pretrained_tokenizer()
        else:
            vocab_size, max_length, choices = self._sizes(splits)
            # With the chosen sizes, exactly what a config that states them builds: a rerun from config.yaml is exact.
            tokenizer = self._train_tokenizer(splits, vocab_size, max_length)
        state = self._encode(tokenizer, splits, max_length)
        if hp.teacher == "ngram":
            # From the whole texts, not the cut ones: the teacher reads what n-grams it can, the student its tokens.
            state["splits"]["train"].teacher_probs = out_of_fold_probabilities(
                splits.texts["train"], splits.labels["train"], len(splits.label_names), seed=hp.seed,
                source=splits.sources.get("train", "train"),
                class_weight="balanced" if state_is_imbalanced(state, splits) else None)
        return {**state, "max_length": max_length, "vocab_size": vocab_size, "choices": choices}

    def _pretrained_tokenizer(self):
        """The tokenizer, vocab_size and max_length of the pretraining checkpoint `tokenizer_from`: fine-tuning reads
        text exactly as pretraining did. data.vocab_size / data.max_length, when set, must be the same."""
        path, hp = self.hparams.tokenizer_from, self.hparams
        checkpoint = read_pretraining_checkpoint(path)
        saved = checkpoint["PretrainDataModule"]
        network = checkpoint["hyper_parameters"]["network"]  # the sizes are stored once, with the network
        vocab_size, max_length = network["vocab_size"], network["max_length"]
        for name, mine, theirs in (("vocab_size", hp.vocab_size, vocab_size),
                                   ("max_length", hp.max_length, max_length)):
            if mine is not None and mine != theirs:
                raise DataError(f"data.{name} {mine} differs from the pretraining checkpoint {path}'s {theirs}: "
                                f"leave data.{name} unset (fine-tuning uses the checkpoint's tokenizer and sizes)")
        choice = (f"tokenizer, vocab_size {vocab_size} and max_length {max_length} from the pretraining checkpoint "
                  f"{path}")
        return load_tokenizer(saved["tokenizer"], max_length=max_length), vocab_size, max_length, [choice]

    def _train_tokenizer(self, splits: Splits, vocab_size: int, max_length: int):
        hp = self.hparams
        return train_tokenizer(
            CutTexts(splits.texts["train"], max_length), vocab_size=vocab_size, max_length=max_length,
            kind=hp.tokenizer, split_cjk=hp.split_cjk, split_punctuation=hp.split_punctuation,
        )

    def _sizes(self, splits: Splits) -> tuple[int, int, list[str]]:
        """vocab_size and max_length as set, or chosen from the training texts where unset, with why (logged)."""
        vocab_size, max_length, choices = self.hparams.vocab_size, self.hparams.max_length, []
        if vocab_size is None:
            vocab_size, choice = self._choose_vocab_size(splits)
            choices.append(choice)
        if max_length is None:
            max_length, choice = self._choose_max_length(splits, vocab_size)
            choices.append(choice)
        return vocab_size, max_length, choices

    def _choose_vocab_size(self, splits: Splits) -> tuple[int, str]:
        counts = word_counts(CutTexts(splits.texts["train"], MAX_LENGTH_CAP), split_cjk=self.hparams.split_cjk,
                             split_punctuation=self.hparams.split_punctuation)
        if not counts:
            raise DataError(f"{splits.sources.get('train', 'train')}: every training text is empty after tokenization "
                            "(no words): cannot choose vocab_size; check text_column")
        once = sum(count == 1 for count in counts.values())
        share = once / sum(counts.values())  # of the training text's running words
        keep_once = share > RARE_WORD_SHARE
        kept = len(counts) if keep_once else len(counts) - once
        vocab_size = min(VOCAB_SIZE_CAP, max(kept, 1) + len(SPECIAL_TOKENS))
        return vocab_size, (f"vocab_size {vocab_size}: {kept} of the {len(counts)} distinct training words, + "
                            f"{', '.join(SPECIAL_TOKENS)} (at most {VOCAB_SIZE_CAP}); the {once} seen once, "
                            f"{100 * share:.1f}% of the text, "
                            f"{'kept' if keep_once else 'left out'} (kept above {100 * RARE_WORD_SHARE:.0f}%)")

    def _choose_max_length(self, splits: Splits, vocab_size: int) -> tuple[int, str]:
        caps = self.hparams.max_length_caps or [MAX_LENGTH_CAP]
        cap = max(caps)
        probe = self._train_tokenizer(splits, vocab_size, cap)
        probe.no_truncation()
        texts = splits.texts["train"]
        lengths = []
        with progress_bar(len(texts), "measuring lengths") as progress:
            for at in range(0, len(texts), ENCODE_CHUNK):
                lengths += [len(e.ids) for e in probe.encode_batch(cut(texts[at : at + ENCODE_CHUNK], cap))]
                progress.update(min(ENCODE_CHUNK, len(texts) - at))
        lengths.sort()
        if lengths[-1] == 0:
            raise DataError(f"{splits.sources.get('train', 'train')}: every training text is empty after tokenization: "
                            "cannot choose max_length; check text_column")
        why = f"max_length_caps {caps}"
        if len(caps) == 2:
            long_share = sum(length > caps[0] for length in lengths) / len(lengths)
            cap = caps[1] if long_share > LONG_TEXT_SHARE else caps[0]
            why += (f": {100 * long_share:.1f}% of training texts are longer than {caps[0]} tokens, "
                    f"{'more' if cap == caps[1] else 'not more'} than {100 * LONG_TEXT_SHARE:.0f}%")
        at_percentile = lengths[min(len(lengths) - 1, math.ceil(LENGTH_PERCENTILE / 100 * len(lengths)) - 1)]
        max_length = min(cap, 8 * math.ceil(max(at_percentile, 1) / 8))
        longer = sum(length > max_length for length in lengths) / len(lengths)
        which = "the longest training text" if LENGTH_PERCENTILE == 100 else f"{LENGTH_PERCENTILE}th percentile of training lengths"
        return max_length, (f"max_length {max_length}: {which} ({at_percentile} tokens) "
                            f"rounded up to a multiple of 8, at most {cap} ({why}); {100 * longer:.1f}% of "
                            "training texts are longer and get cut")

    def prepare_data(self):
        self.state  # noqa: B018  (builds the cache once, before the loaders need it)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        data = self.split(split)
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        weights = balanced_draws(data.labels, len(self.label_names)) if shuffle and self.balanced_sampler else None
        epoch_of = (lambda: trainer.current_epoch) if trainer is not None else None
        sampler = BucketBatchSampler(
            data.lengths, self.hparams.batch_size, shuffle, self.hparams.seed, rank, world, self.bucket_pool, weights,
            epoch_of,
        )
        return DataLoader(
            data, batch_sampler=sampler, collate_fn=collate, num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
        )

    def train_dataloader(self):
        if self.balanced_sampler:
            counts = class_counts(self.split("train").labels, len(self.label_names))
            log.info("balanced sampler (data.balanced_sampler): each class %.0f%% of the training batches; %s",
                     100 / len(self.label_names), describe_counts(counts, self.label_names))
        return self._loader("train", shuffle=True)

    def val_dataloader(self):
        return self._loader("validation", shuffle=False)

    def test_dataloader(self):
        if "test" not in self.state["splits"]:
            raise DataError(NO_TEST_SPLIT)
        return self._loader("test", shuffle=False)

    def predict_dataloader(self):
        return self._loader("test" if "test" in self.state["splits"] else "validation", shuffle=False)

    def state_dict(self) -> dict:
        """Saved in every checkpoint: the tokenizer that turns raw text into the model's input (stored_form: its
        max_length and the label names are stored once, in the model's hyperparameters)."""
        return {"tokenizer": stored_form(self.state["tokenizer"])}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint restored for fit (resume), validate, test or predict: the data must be encoded with the
        tokenizer the model was trained with. Lightning calls this before it builds the dataloaders, so they see
        what is set here. (train.py has checked the checkpoint's label names and max_length against these data
        before: training/checkpoints.py.)

        A tokenizer that differs from the one trained on these data (one trained before a CACHE_VERSION change, or
        by another `tokenizers` release) is adopted: the splits are read and encoded again with it, in memory (the
        cache keeps the data's own tokenizer)."""
        if stored_form(state["tokenizer"]) != stored_form(self.state["tokenizer"]):
            log.info("the checkpoint's tokenizer differs from the one trained on these data: "
                     "encoding them with the checkpoint's")
            tokenizer = load_tokenizer(state["tokenizer"], max_length=self.max_length)
            sizes = {key: self._state[key] for key in ("max_length", "vocab_size")}
            teacher_probs = self._state["splits"]["train"].teacher_probs  # same texts, same order
            self._state = {**self._encode(tokenizer, self._read_splits(), self.max_length), **sizes}
            self._state["splits"]["train"].teacher_probs = teacher_probs
            self._tokenizer = tokenizer


def return_freed_memory() -> None:
    """Hand the memory that reading, tokenizing and the teacher freed back to the system: glibc keeps freed small
    blocks in its heap, and the run would carry them to its end (IMDB, built: 1.0 GB resident, 0.54 GB after)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): they return memory their own way
        pass


def state_is_imbalanced(state: dict, splits: Splits) -> bool:
    """Single-label classes imbalanced enough for balanced weights (data/labels.py is_imbalanced)."""
    counts = class_counts(state["splits"]["train"].labels, len(splits.label_names))
    return not splits.multi_label and is_imbalanced(counts, False)


def _stat(path) -> tuple[int, int]:
    try:
        st = os.stat(path)
        return st.st_size, int(st.st_mtime)
    except OSError:
        raise DataError(f"{path}: file not found") from None
