"""A tokenizer trained on the training split only (Hugging Face `tokenizers`), stored in the checkpoint as JSON.

The BERT normalizer puts spaces around every CJK character, so Chinese becomes one token per character
instead of one token per sentence; English is lower-cased and split into word pieces.
"""

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PAD, UNK = "[PAD]", "[UNK]"  # ids 0 and 1
KINDS = ("wordpiece", "word")


def train_tokenizer(texts: list[str], *, vocab_size: int, max_length: int, kind: str = "wordpiece") -> Tokenizer:
    if kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token=UNK))
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=[PAD, UNK], show_progress=False)
        tokenizer.decoder = decoders.WordPiece()
    elif kind == "word":  # whole words; unseen words become [UNK]
        tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=[PAD, UNK], show_progress=False)
    else:
        raise ValueError(f"tokenizer kind must be one of {KINDS}, got {kind!r}")
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, handle_chinese_chars=True, strip_accents=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.enable_truncation(max_length)
    return tokenizer


def load_tokenizer(json_string: str) -> Tokenizer:
    return Tokenizer.from_str(json_string)
