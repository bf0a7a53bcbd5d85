"""The DataModule: the splits read, the tokenizer made on train, encoded once (cached), length-bucketed batches
(data/batches.py says what a batch holds). Soft targets of a teacher are fitted by the training side
(training/teacher.py) and attached to the training split (attach_soft_targets)."""

import logging
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from data.batches import balanced_draws, loader
from data.cache import encoded_path, load_encoded
from data.encoded import EncodedSplit, encode_splits
from data.labels import class_counts, describe_counts, is_imbalanced
from data.sizes import bucket_pool, check_sizes, choose_sizes
from data.sources import DataError, load_splits, local_copy_dir
from data.splitting import Splits
from data.tokenizer import KINDS, CutTexts, load_tokenizer, pretrained_tokenizer, stored_form, \
    train_tokenizer

log = logging.getLogger(__name__)
NO_TEST_SPLIT = ("no test split (SST-2's test labels are not public: its held-out figure is `validate`): give "
                 "data.test_file, or use a dataset with a labelled test split")


class TextDataModule(L.LightningDataModule):
    """The data of a run, built once (or read from the cache) when first asked for: read the splits (data/sources.py)
    → choose the sizes left unset (data/sizes.py) → the tokenizer (data/tokenizer.py) → encode (data/encoded.py),
    cached under a key of the settings and files (data/cache.py); then batches (data/batches.py)."""

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
            teacher: "ngram" = the training batches carry the class probabilities of a TF-IDF n-gram + logistic
                regression teacher for each text (out of fold; needs scikit-learn), for model.distillation: fitted
                by `train.py fit` before training (training/teacher.py) and cached apart from the encoded data,
                then attached here (attach_soft_targets). None = no teacher.
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
        check_sizes(max_length=max_length, vocab_size=vocab_size, batch_size=batch_size, bucket_pool=bucket_pool,
                    num_workers=num_workers, max_length_caps=max_length_caps)  # refused before anything is read
        if teacher not in (None, "ngram"):
            raise DataError(f"teacher must be ngram or null, got {teacher!r}")
        if tokenizer not in KINDS:
            raise DataError(f"tokenizer must be one of {', '.join(KINDS)}, got {tokenizer!r}")
        self.save_hyperparameters()
        self._state = None  # {"tokenizer": json, "label_names": [...], "splits": {name: EncodedSplit}, sizes}
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
        """data.bucket_pool, or chosen from max_length when it was left unset (data/sizes.py)."""
        return self.hparams.bucket_pool if self.hparams.bucket_pool is not None else bucket_pool(self.max_length)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.state["tokenizer"])
        return self._tokenizer

    @property
    def state(self) -> dict:
        if self._state is None:
            self._record_local_copy()
            stored, self._files_read = load_encoded(dict(self.hparams), lambda: as_stored(self._build()))
            self._state = {**stored, "splits": {name: EncodedSplit(**s) for name, s in stored["splits"].items()}}
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
        """The encoded data's cache file; `chosen`: sizes to key it by in place of the unset ones (data/cache.py)."""
        return encoded_path(dict(self.hparams), **chosen)

    def files_read(self) -> list[list]:
        """[path, size, modification time] of each data file as it was read, for the checkpoint (diagnose.py notes a
        file changed since training)."""
        self.state  # noqa: B018  (the stamps are taken when the data are read)
        return self._files_read

    def read_splits(self) -> Splits:
        """The splits as the settings read them (data/sources.py), the same texts in the same order every time."""
        hp = self.hparams
        return load_splits(
            dataset=hp.dataset, data_dir=hp.data_dir, train_file=hp.train_file, val_file=hp.val_file,
            test_file=hp.test_file, text_column=hp.text_column, label_column=hp.label_column,
            val_fraction=hp.val_fraction, seed=hp.seed, label_separator=hp.get("label_separator"),
            label_names_file=hp.get("label_names_file"),
        )

    def _build(self) -> dict:
        splits = self.read_splits()
        tokenizer, sizes = self._tokenizer_for(splits)
        return {"tokenizer": tokenizer.to_str(), "label_names": splits.label_names, "multi_label": splits.multi_label,
                "splits": encode_splits(tokenizer, splits, sizes["max_length"]), **sizes}

    def _tokenizer_for(self, splits: Splits) -> tuple:
        """The tokenizer and the sizes: a pretraining checkpoint's (tokenizer_from: fine-tuning reads text exactly as
        pretraining did), or sizes chosen where unset (data/sizes.py) and a tokenizer trained on the training split
        with them, exactly what a config that states those sizes builds: a rerun from config.yaml is exact."""
        hp = self.hparams
        if hp.get("tokenizer_from"):  # (a pretraining run's data have none)
            tokenizer, vocab_size, max_length, choices = pretrained_tokenizer(
                hp.tokenizer_from, vocab_size=hp.vocab_size, max_length=hp.max_length)
        else:
            train = splits.texts["train"]
            words = {"split_cjk": hp.split_cjk, "split_punctuation": hp.split_punctuation}
            vocab_size, max_length, choices = choose_sizes(
                train, splits.sources.get("train", "train"), vocab_size=hp.vocab_size, max_length=hp.max_length,
                caps=hp.max_length_caps, kind=hp.tokenizer, **words)
            tokenizer = train_tokenizer(CutTexts(train, max_length), vocab_size=vocab_size, max_length=max_length,
                                        kind=hp.tokenizer, **words)
        return tokenizer, {"vocab_size": vocab_size, "max_length": max_length, "choices": choices}

    def attach_soft_targets(self, probabilities: torch.Tensor) -> None:
        """A teacher's (N, C) probabilities for the N training texts, in the order read (training/teacher.py): from
        here on each training batch carries its rows as teacher_probs."""
        train = self.split("train")
        expected = (len(train), len(self.label_names))
        if tuple(probabilities.shape) != expected:
            raise DataError(f"the teacher's probabilities have shape {tuple(probabilities.shape)}, the training split "
                            f"needs {expected} (one row a training text, one column a class)")
        train.teacher_probs = probabilities

    def prepare_data(self):
        self.state  # noqa: B018  (builds the cache once, before the loaders need it)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        data, hp = self.split(split), self.hparams
        weights = balanced_draws(data.labels, len(self.label_names)) if shuffle and self.balanced_sampler else None
        return loader(data, hp.batch_size, shuffle, hp.seed, self.bucket_pool, weights, hp.num_workers, self.trainer)

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
            attached = self._state["splits"]["train"].attached()  # same texts, same order
            self._state = {**self._state, "tokenizer": tokenizer.to_str(),
                           "splits": encode_splits(tokenizer, self.read_splits(), self.max_length)}
            for name, rows in attached.items():
                setattr(self._state["splits"]["train"], name, rows)
            self._tokenizer = tokenizer


def as_stored(state: dict) -> dict:
    """The built data as the cache stores them: plain tensors, lists and strings (read with weights_only)."""
    return {**state, "splits": {name: split.state() for name, split in state["splits"].items()}}
