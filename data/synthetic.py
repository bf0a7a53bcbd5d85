"""`synthetic`: a generated task whose labels need attention between positions, for smoke tests with no files."""

import random


def synthetic(n: int = 4000, seed: int = 0, vocab: int = 30, min_len: int = 6, max_len: int = 16) -> dict[str, tuple]:
    """Label = which marker comes first ("alpha" before "beta" → 1): only attention between positions solves it;
    a bag of words sees the same two markers either way."""
    from data.columns import TextColumn

    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        words = [f"w{rng.randrange(vocab)}" for _ in range(rng.randint(min_len, max_len))]
        i, j = sorted(rng.sample(range(len(words) + 2), 2))
        first, second = ("alpha", "beta") if rng.random() < 0.5 else ("beta", "alpha")
        words.insert(i, first)
        words.insert(j, second)
        texts.append(" ".join(words))
        labels.append(int(first == "alpha"))
    return {"all": (TextColumn(texts), labels)}
