"""The sizes the data decide when a config leaves them unset, chosen from the training split alone (logged, and
written into the run's config.yaml as numbers, so a rerun from it is exact):

    vocab_size   the training words seen twice or more, at most VOCAB_SIZE_CAP (the most frequent); those seen
                 once too where they are more than RARE_WORD_SHARE of the text (small data)
    max_length   the longest training text in tokens, rounded up to a multiple of 8, at most the network's cap
    bucket_pool  random batches for short texts, length-sorted pools for long ones
"""

import math
import os

from data.progress import progress_bar
from data.sources import DataError
from data.tokenizer import FIRST_WORD_ID, SPECIAL_TOKENS, CutTexts, cut, train_tokenizer, word_counts

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
MEASURE_CHUNK = 10_000  # texts tokenized at a time when measuring lengths
# Upper bounds on the settings that size memory (model/config.py bounds the network the same way):
MAX_BATCH_SIZE = 65536
MAX_VOCAB_SIZE = 1_048_576
MAX_WORKERS = 64  # DataLoader processes (or the CPU count, if larger)


def check_sizes(*, max_length, vocab_size, batch_size, bucket_pool, num_workers, max_length_caps) -> None:
    """DataError (one line naming the setting and its value) for a size out of its range."""
    if max_length_caps is not None and (not 1 <= len(max_length_caps) <= 2 or min(max_length_caps) < 1
                                        or list(max_length_caps) != sorted(max_length_caps)):
        raise DataError(f"data.max_length_caps must be one length >= 1, or two rising, got {max_length_caps}")
    if bucket_pool is not None and bucket_pool < 1:
        raise DataError(f"bucket_pool must be >= 1 (or null: chosen from max_length), got {bucket_pool}")
    if (max_length is not None and max_length < 1) or batch_size < 1 or (vocab_size is not None
                                                                         and vocab_size <= FIRST_WORD_ID):
        raise DataError(f"max_length, batch_size must be >= 1 and vocab_size >= {FIRST_WORD_ID + 1}, got "
                        f"{max_length}, {batch_size}, {vocab_size}")
    for name, value, most in (("batch_size", batch_size, MAX_BATCH_SIZE), ("vocab_size", vocab_size, MAX_VOCAB_SIZE)):
        if value is not None and value > most:  # sizes memory
            raise DataError(f"data.{name} {value} is larger than {most}")
    most_workers = max(MAX_WORKERS, os.cpu_count() or 1)
    if not 0 <= num_workers <= most_workers:  # each worker is a process holding its own copy of the dataset
        raise DataError(f"data.num_workers must be in 0..{most_workers}, got {num_workers}")


def choose_sizes(texts, source: str, *, vocab_size: int | None, max_length: int | None, caps: list[int] | None,
                 kind: str, split_cjk: bool, split_punctuation: bool) -> tuple[int, int, list[str]]:
    """(vocab_size, max_length, why): each as set, or chosen from the training texts where unset, with a line
    saying why for each chosen one. `source` names the texts' file in errors."""
    choices = []
    if vocab_size is None:
        vocab_size, choice = choose_vocab_size(texts, source, split_cjk, split_punctuation)
        choices.append(choice)
    if max_length is None:
        max_length, choice = choose_max_length(texts, source, vocab_size, caps or [MAX_LENGTH_CAP], kind=kind,
                                               split_cjk=split_cjk, split_punctuation=split_punctuation)
        choices.append(choice)
    return vocab_size, max_length, choices


def bucket_pool(max_length: int) -> int:
    """bucket_pool when unset: random batches up to MAX_LENGTH_CAP tokens, length-sorted pools beyond."""
    return SHORT_BUCKET_POOL if max_length <= MAX_LENGTH_CAP else LONG_BUCKET_POOL


def choose_vocab_size(texts, source: str, split_cjk: bool, split_punctuation: bool) -> tuple[int, str]:
    counts = word_counts(CutTexts(texts, MAX_LENGTH_CAP), split_cjk=split_cjk, split_punctuation=split_punctuation)
    if not counts:
        raise DataError(f"{source}: every training text is empty after tokenization (no words): cannot choose "
                        "vocab_size; check text_column")
    once = sum(count == 1 for count in counts.values())
    share = once / sum(counts.values())  # of the training text's running words
    keep_once = share > RARE_WORD_SHARE
    kept = len(counts) if keep_once else len(counts) - once
    vocab_size = min(VOCAB_SIZE_CAP, max(kept, 1) + len(SPECIAL_TOKENS))
    return vocab_size, (f"vocab_size {vocab_size}: {kept} of the {len(counts)} distinct training words, + "
                        f"{', '.join(SPECIAL_TOKENS)} (at most {VOCAB_SIZE_CAP}); the {once} seen once, "
                        f"{100 * share:.1f}% of the text, "
                        f"{'kept' if keep_once else 'left out'} (kept above {100 * RARE_WORD_SHARE:.0f}%)")


def choose_max_length(texts, source: str, vocab_size: int, caps: list[int], **tokenizer) -> tuple[int, str]:
    """Measured with a tokenizer trained as the run's will be, at the largest cap and without truncation."""
    cap = max(caps)
    probe = train_tokenizer(CutTexts(texts, cap), vocab_size=vocab_size, max_length=cap, **tokenizer)
    probe.no_truncation()
    lengths = []
    with progress_bar(len(texts), "measuring lengths") as progress:
        for at in range(0, len(texts), MEASURE_CHUNK):
            lengths += [len(e.ids) for e in probe.encode_batch(cut(texts[at : at + MEASURE_CHUNK], cap))]
            progress.update(min(MEASURE_CHUNK, len(texts) - at))
    lengths.sort()
    if lengths[-1] == 0:
        raise DataError(f"{source}: every training text is empty after tokenization: cannot choose max_length; "
                        "check text_column")
    why = f"max_length_caps {caps}"
    if len(caps) == 2:
        long_share = sum(length > caps[0] for length in lengths) / len(lengths)
        cap = caps[1] if long_share > LONG_TEXT_SHARE else caps[0]
        why += (f": {100 * long_share:.1f}% of training texts are longer than {caps[0]} tokens, "
                f"{'more' if cap == caps[1] else 'not more'} than {100 * LONG_TEXT_SHARE:.0f}%")
    at_percentile = lengths[min(len(lengths) - 1, math.ceil(LENGTH_PERCENTILE / 100 * len(lengths)) - 1)]
    max_length = min(cap, 8 * math.ceil(max(at_percentile, 1) / 8))
    longer = sum(length > max_length for length in lengths) / len(lengths)
    which = ("the longest training text" if LENGTH_PERCENTILE == 100
             else f"{LENGTH_PERCENTILE}th percentile of training lengths")
    return max_length, (f"max_length {max_length}: {which} ({at_percentile} tokens) rounded up to a multiple of 8, "
                        f"at most {cap} ({why}); {100 * longer:.1f}% of training texts are longer and get cut")
