"""A tokenizer trained on the training split only (Hugging Face `tokenizers`), stored in the checkpoint as JSON.

The BERT normalizer puts spaces around every CJK character, so Chinese becomes one token per character
instead of one token per sentence; English is lower-cased and split into word pieces.
"""

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PAD, UNK = "[PAD]", "[UNK]"
PAD_ID, UNK_ID = 0, 1  # the trainers put the special tokens first, in this order (tests/test_data.py checks)
KINDS = ("wordpiece", "word")


def train_tokenizer(
    texts: list[str],
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
    already tokenized, where "n't" and "'s" are words of their own)."""
    if kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token=UNK))
        # limit_alphabet: the characters seen are kept whole otherwise, and a Chinese corpus has thousands,
        # which would push the vocabulary past vocab_size (the model's embedding has exactly vocab_size rows).
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=[PAD, UNK], limit_alphabet=max(1, vocab_size // 2), show_progress=False
        )
        tokenizer.decoder = decoders.WordPiece()
    elif kind == "word":  # whole words; unseen words become [UNK]
        tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=[PAD, UNK], show_progress=False)
    else:
        raise ValueError(f"tokenizer kind must be one of {KINDS}, got {kind!r}")
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, handle_chinese_chars=split_cjk, strip_accents=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer() if split_punctuation else pre_tokenizers.WhitespaceSplit()
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.enable_truncation(max_length)
    assert tokenizer.get_vocab_size() <= vocab_size, "the tokenizer outgrew vocab_size"
    return tokenizer


def load_tokenizer(json_string: str) -> Tokenizer:
    return Tokenizer.from_str(json_string)
