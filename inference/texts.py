"""Which texts the model can read, checked one text at a time before any text joins a batch.

A text the tokenizer cannot take (a lone UTF-16 surrogate, which a JSON "\\ud800" escape or a Python string can hold
but UTF-8 cannot) would fail the whole batch it joins, so it is found here, on its own, and answered on its own:
predict.py and serve.py give it {"text", "error"} in its place, the Python API a ValueError naming its position.
Imports nothing heavy: the faces use it before torch is loaded.
"""

from data.reading import has_text

# A text cut before tokenizing has its own length in tokens counted on at most this many characters (a fraction of
# a second); a longer one reports the length of those, a lower bound.
COUNT_CHARACTERS = 1_000_000
EMPTY = "empty text"  # the error of an empty or whitespace-only text
SHOWN = 10  # positions named in one error


def length_is_lower_bound(text: str) -> bool:
    """True when a truncated text's reported length in tokens is a lower bound (see TextClassifier.encode)."""
    return len(text) > COUNT_CHARACTERS


def problem(text: str) -> str | None:
    """Why the model cannot classify this text, in a few words, or None when it can."""
    if not has_text(text):
        return EMPTY
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"not Unicode text: a lone surrogate U+{ord(text[e.start]):04X} at character {e.start} (half of a "
                "UTF-16 pair; shown as U+FFFD here)")
    return None


def writable(text: str) -> str:
    """The text as it can be written as UTF-8 (JSON, a terminal): each lone surrogate replaced by U+FFFD."""
    if text.isascii():
        return text
    return "".join("\ufffd" if "\ud800" <= character <= "\udfff" else character for character in text)


def check_texts(texts, call: str) -> list[str]:
    """The texts as a list, or TypeError / ValueError (one line naming the positions) for the Python API's `call`
    (predict, explain): every text must be a non-empty string the tokenizer can read."""
    if isinstance(texts, str):
        raise TypeError(f"{call} takes a list of texts; wrap a single text in a list")
    texts = list(texts)
    not_text = [f"{i} ({type(text).__name__})" for i, text in enumerate(texts) if not isinstance(text, str)]
    if not_text:
        raise TypeError(f"texts must be strings; not a string at position(s) {', '.join(not_text[:SHOWN])}")
    problems = [(i, problem(text)) for i, text in enumerate(texts)]
    problems = [(i, why) for i, why in problems if why is not None]
    if problems:
        shown = "; ".join(f"{i}: {why}" for i, why in problems[:SHOWN])
        raise ValueError(f"{len(problems)} text(s) cannot be classified (position: why): {shown}")
    return texts
