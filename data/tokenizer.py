"""A tokenizer trained on the training split only (Hugging Face `tokenizers`), stored in the checkpoint as JSON.

The BERT normalizer puts spaces around every CJK character, so Chinese becomes one token per character
instead of one token per sentence; English is lower-cased and split into word pieces.

Training is deterministic: the same texts and settings give the same JSON in every process (see wordpiece_trainer).
"""

import json
import logging
from collections import Counter
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from data.progress import progress_bar
from data.sources import DataError

if TYPE_CHECKING:  # torch is imported where batches are made: training a tokenizer alone loads no torch
    import torch

log = logging.getLogger(__name__)
# The special tokens, the one table of them: a token's id is its place here, since the trainers put the special
# tokens first, in this order (tests/test_data.py checks). Every other id is a word (or word piece).
SPECIAL_TOKENS = ("[PAD]", "[UNK]")
PAD, UNK = SPECIAL_TOKENS
PAD_ID, UNK_ID = range(len(SPECIAL_TOKENS))
MASK_ID = UNK_ID  # masked-token pretraining hides a token behind [UNK], the token token_dropout puts in when fine-tuning
FIRST_WORD_ID = len(SPECIAL_TOKENS)
# A text may hold the ids PAD_ID and UNK_ID itself: "[PAD]" or "[UNK]" typed in it are matched as those tokens, in
# training and prediction alike. So padding is never found by matching ids: padding_mask() builds it from lengths.
KINDS = ("wordpiece", "word")
PREFIX = "##"  # marks a word piece that continues a word


def train_tokenizer(
    texts,
    *,
    vocab_size: int,
    max_length: int,
    kind: str = "wordpiece",
    split_cjk: bool = True,
    split_punctuation: bool = True,
) -> Tokenizer:
    """split_cjk: every CJK character its own word (True), or runs of CJK characters left whole so that word
    pieces learn multi-character words such as 服务 or 房间 (False; Chinese has no spaces to split on).
    split_punctuation: split words at punctuation too (True), or at whitespace only (False, for text that is
    already tokenized, where "n't" and "'s" are words of their own).
    texts: any sequence of texts (a list, a TextColumn, CutTexts): it is read from start to end, twice for
    wordpiece, never held whole."""
    if kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token=UNK))
        tokenizer.decoder = decoders.WordPiece()
    elif kind == "word":  # whole words; unseen words become [UNK]
        tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
    else:
        raise ValueError(f"tokenizer kind must be one of {KINDS}, got {kind!r}")
    set_word_splitting(tokenizer, split_cjk=split_cjk, split_punctuation=split_punctuation)
    if kind == "wordpiece":
        trainer = wordpiece_trainer(tokenizer, texts, vocab_size)
        tokenizer.train_from_iterator(with_progress(texts, "training tokenizer"), trainer, length=len(texts))
        tokenizer = without_added_tokens(tokenizer, keep=SPECIAL_TOKENS)
    else:  # the word-level trainer orders words by count, then by the word itself: deterministic as it is
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                            show_progress=False)
        tokenizer.train_from_iterator(with_progress(texts, "training tokenizer"), trainer, length=len(texts))
    if tokenizer.get_vocab_size() > vocab_size:  # the trainers promise otherwise; never train a model on it
        raise DataError(f"vocab_size {vocab_size}: the trained tokenizer has {tokenizer.get_vocab_size()} tokens")
    tokenizer.enable_truncation(max_length)
    return tokenizer


def set_word_splitting(tokenizer: Tokenizer, *, split_cjk: bool, split_punctuation: bool) -> Tokenizer:
    """How text becomes words before any vocabulary: lower-cased BERT normalizing, then a split at whitespace (and
    punctuation)."""
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, handle_chinese_chars=split_cjk, strip_accents=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer() if split_punctuation else pre_tokenizers.WhitespaceSplit()
    return tokenizer


def word_counts(texts, *, split_cjk: bool = True, split_punctuation: bool = True) -> Counter:
    """How often each word occurs, split as train_tokenizer splits text into words (before word pieces)."""
    splitter = set_word_splitting(Tokenizer(models.WordLevel(unk_token=UNK)), split_cjk=split_cjk,
                                  split_punctuation=split_punctuation)
    chunks = whitespace_chunks(splitter, texts)
    words = Counter()
    for chunk, count in chunks.items():  # each distinct whitespace chunk is split once (see character_counts)
        for word, _ in splitter.pre_tokenizer.pre_tokenize_str(chunk):
            words[word] += count
    return words


def wordpiece_trainer(tokenizer: Tokenizer, texts: list[str], vocab_size: int) -> trainers.WordPieceTrainer:
    """A WordPiece trainer that gives the same vocabulary in every process, and never more than vocab_size tokens.

    Left alone, the Hugging Face trainer numbers the "##x" pieces in hash order (random per process) and breaks
    ties between equally frequent merges by those numbers, so even the learned set of tokens changed from run to run;
    its limit_alphabet also drops characters of equal count at random. Here the alphabet is chosen up front and every
    "##x" piece is handed over as a special token, in sorted order, so every number is fixed. without_added_tokens
    then makes them ordinary tokens again.

    The alphabet: the most frequent characters, at most half of vocab_size (the rest is left for learned pieces),
    and only as many as fit with their "##x" forms and [PAD], [UNK]. Rarer characters become [UNK] (logged).
    """
    starts, inner = character_counts(tokenizer, texts)
    total = starts + inner
    by_count = sorted(total, key=lambda char: (-total[char], char))  # ties by the character: no randomness
    alphabet, size = [], len(SPECIAL_TOKENS)
    for char in by_count:
        cost = 1 + (char in inner)  # the character, and its "##x" form if it ever continues a word
        if len(alphabet) >= max(1, vocab_size // 2) or size + cost > vocab_size:
            break
        alphabet.append(char)
        size += cost
    if by_count and not alphabet:
        smallest = len(SPECIAL_TOKENS) + 1 + (by_count[0] in inner)
        raise DataError(f"vocab_size {vocab_size} cannot hold [PAD], [UNK] and one character: use at least {smallest}")
    if len(alphabet) < len(total):
        dropped = sum(total.values()) - sum(total[char] for char in alphabet)
        log.info("vocab_size %d keeps the %d most frequent of %d characters; the rest (%.2g%% of all characters) "
                 "become [UNK]", vocab_size, len(alphabet), len(total), 100 * dropped / sum(total.values()))
    pieces = sorted(PREFIX + char for char in alphabet if char in inner)
    return trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=[*SPECIAL_TOKENS, *pieces], initial_alphabet=alphabet,
        limit_alphabet=len(alphabet), continuing_subword_prefix=PREFIX, show_progress=False,
    )


def character_counts(tokenizer: Tokenizer, texts: list[str]) -> tuple[Counter, Counter]:
    """How often each character starts a word, and how often it continues one, after normalizing and splitting
    into words as the tokenizer does. Texts are first split at whitespace and counted, so that the slow per-word
    step runs once per distinct chunk (IMDB: 250k chunks instead of 6M words)."""
    chunks = whitespace_chunks(tokenizer, texts)
    starts, inner = Counter(), Counter()
    for chunk, count in chunks.items():
        for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(chunk):
            starts[word[0]] += count
            for char in word[1:]:
                inner[char] += count
    return starts, inner


def with_progress(texts, what: str):
    """The texts one by one, counted by a progress bar."""
    with progress_bar(len(texts), what) as progress:
        for text in texts:
            yield text
            progress.update()


def whitespace_chunks(tokenizer: Tokenizer, texts) -> Counter:
    """How often each whitespace-separated chunk of the normalized texts occurs."""
    chunks = Counter()
    with progress_bar(len(texts), "counting words") as progress:
        for text in texts:
            chunks.update(tokenizer.normalizer.normalize_str(text).split())
            progress.update()
    return chunks


def without_added_tokens(tokenizer: Tokenizer, keep: tuple[str, ...]) -> Tokenizer:
    """The same tokenizer with only `keep` as special tokens: the "##x" pieces stay in the vocabulary with their
    ids, but are no longer matched in raw text or skipped when decoding."""
    config = json.loads(tokenizer.to_str())
    config["added_tokens"] = [token for token in config["added_tokens"] if token["content"] in keep]
    return Tokenizer.from_str(json.dumps(config))


def pretrained_tokenizer(path, *, vocab_size: int | None, max_length: int | None) -> tuple:
    """(tokenizer, vocab_size, max_length, [why]) of the pretraining checkpoint at `path` (train.py pretrain): fine-tuning
    reads text exactly as pretraining did. vocab_size / max_length, when set, must be the checkpoint's."""
    from data.checkpoint import PRETRAINING_DATA, read_pretraining_checkpoint  # torch: only for a checkpoint

    checkpoint = read_pretraining_checkpoint(path)
    network = checkpoint["hyper_parameters"]["network"]  # the sizes are stored once, with the network
    theirs = {"vocab_size": network["vocab_size"], "max_length": network["max_length"]}
    for name, mine in (("vocab_size", vocab_size), ("max_length", max_length)):
        if mine is not None and mine != theirs[name]:
            raise DataError(f"data.{name} {mine} differs from the pretraining checkpoint {path}'s {theirs[name]}: "
                            f"leave data.{name} unset (fine-tuning uses the checkpoint's tokenizer and sizes)")
    why = (f"tokenizer, vocab_size {theirs['vocab_size']} and max_length {theirs['max_length']} from the pretraining "
           f"checkpoint {path}")
    tokenizer = load_tokenizer(checkpoint[PRETRAINING_DATA]["tokenizer"], max_length=theirs["max_length"])
    return tokenizer, theirs["vocab_size"], theirs["max_length"], [why]


def load_tokenizer(json_string: str, max_length: int | None = None) -> Tokenizer:
    """The tokenizer a JSON string holds; with max_length, it cuts encodings to that many tokens."""
    tokenizer = Tokenizer.from_str(json_string)
    if max_length is not None:
        tokenizer.enable_truncation(max_length)
    return tokenizer


def stored_form(json_string: str) -> str:
    """A tokenizer's JSON as a checkpoint stores it: without truncation, since max_length is stored once, with the
    network's settings. Two tokenizers encode alike when their stored forms are equal."""
    tokenizer = Tokenizer.from_str(json_string)
    tokenizer.no_truncation()
    return tokenizer.to_str()


# Texts are cut to this many characters per token of max_length before tokenizing, so a 1 MB line costs no more
# than a long review. Real text has 1-2 (Chinese) to 4-6 (English) characters per token: a cut text still holds
# far more than max_length tokens, and the tokens past max_length are dropped anyway.
CHARS_PER_TOKEN_BOUND = 50


def cut(texts: list[str], max_length: int) -> list[str]:
    """Texts cut to max_length * CHARS_PER_TOKEN_BOUND characters, for tokenizer training and encoding alike."""
    return [text[: max_length * CHARS_PER_TOKEN_BOUND] for text in texts]


class CutTexts:
    """The texts as `cut` cuts them, cut one by one as they are read (each time they are iterated): a split is
    counted and trained on without a second copy of it in memory."""

    def __init__(self, texts, max_length: int):
        self.texts, self.limit = texts, max_length * CHARS_PER_TOKEN_BOUND

    def __len__(self) -> int:
        return len(self.texts)

    def __iter__(self):
        return (text[: self.limit] for text in self.texts)


def padding_mask(lengths: "torch.Tensor", L: int | None = None) -> "torch.Tensor":
    """The one padding rule: (B, L) bool, True at padding, for texts of `lengths` (B,) tokens padded to L (default
    the longest). From lengths, never from token ids (a text may hold PAD_ID itself)."""
    import torch

    lengths = torch.as_tensor(lengths)
    L = int(lengths.max()) if L is None else L
    return torch.arange(L, device=lengths.device) >= lengths[:, None]  # (B, L)


def pad(sequences) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Token id sequences (lists or 1-d tensors) → input_ids (B, L) long, PAD_ID after each text's end, and
    padding_mask (B, L) bool, True at padding (padding_mask() of their lengths); L is the longest."""
    import torch

    lengths = torch.tensor([len(ids) for ids in sequences])
    input_ids = torch.full((len(sequences), int(lengths.max())), PAD_ID, dtype=torch.long)  # (B, L)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.as_tensor(ids)
    return input_ids, padding_mask(lengths, input_ids.shape[1])
