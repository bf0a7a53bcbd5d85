"""Progress bars for the set-up steps that can take minutes on large data (reading, tokenizer, encoding, teacher)."""

from tqdm.auto import tqdm

PROGRESS_DELAY = 2  # seconds: a bar shows only for a step that takes longer, so small data stay quiet


def progress_bar(total: int | None, what: str, unit: str = "text"):
    """A progress bar with counts, rate and the time left, shown once the step has taken PROGRESS_DELAY seconds."""
    return tqdm(total=total, desc=what, unit=unit, delay=PROGRESS_DELAY, mininterval=1, unit_scale=True)
