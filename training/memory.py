"""Keep a run's resident memory flat when its batches come in many sizes. On with no config (train.py
DEFAULT_CALLBACKS) and listed by both IMDB configs; a config that lists its own callbacks can add it:

    python train.py fit --config my.yaml --trainer.callbacks+=training.memory.ReturnFreedMemory

glibc serves a block under its mmap threshold from its heap and keeps it there once freed, and the threshold grows
with the largest block freed (up to 32 MiB). Batches bucketed by length make activations of many sizes: a batch
longer than the ones before does not fit in the holes they left, the heap grows, and every page once used stays
resident until the heap is trimmed. On whole IMDB reviews the heap's free space reached 7 GB and resident memory
3.3 GB by the fifth epoch.
So this callback, on glibc:
- gives freed memory at the heap's top back at once again (glibc's own trim threshold, where runtime.py keeps
  up to 256 MB of it for the next step's reuse: speed over resident memory);
- maps every block of `mmap_threshold` bytes or more on its own (mallopt M_MMAP_THRESHOLD): freed, it goes straight
  back to the system, whatever size the next batch needs;
- hands the heap's free pages back (malloc_trim) at the start of each training and validation epoch, at the end of
  validation, and, once batches of `min_tokens` (texts × padded length) or more come, every `every` batches and
  before a batch larger than all since the last time. Short batches leave little behind: SST-2's never reach it, so
  they pay no trims (each costs the page faults of the memory handed back, when it is used again).
docs/RESULTS.md "Memory and data size" measures each part and its time.
"""

from lightning.pytorch.callbacks import Callback

from data.cache import return_freed_memory
from model.errors import check_whole_number
from model.threads import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, mallopt

GLIBC_TRIM_THRESHOLD = 128 * 2**10  # glibc's default
MMAP_THRESHOLD = 4 * 2**20
# glibc takes a threshold up to 32 MiB on 64-bit machines (DEFAULT_MMAP_THRESHOLD_MAX) and ignores a larger one; below
# a page every block would be a system call of its own.
MMAP_THRESHOLD_RANGE = (4096, 32 * 2**20)
MIN_TOKENS = 8192  # 32 texts of 256 tokens: IMDB's longer half of batches; SST-2's batches hold 1-4k


def map_large_blocks(threshold: int) -> bool:
    """Blocks of `threshold` bytes or more mapped on their own from now on, when the heap must grow for them."""
    return mallopt(M_MMAP_THRESHOLD, threshold)


class ReturnFreedMemory(Callback):
    def __init__(self, every: int = 10, mmap_threshold: int | None = MMAP_THRESHOLD, min_tokens: int = MIN_TOKENS):
        """every: training and validation batches between two trims. mmap_threshold: blocks this large or larger are
        mapped on their own (each costs page faults when made; null: glibc's own, moving threshold). min_tokens:
        batches (texts × padded length) below this size trigger no trim."""
        check_whole_number("ReturnFreedMemory every", every, 1)
        if mmap_threshold is not None:
            check_whole_number("ReturnFreedMemory mmap_threshold (bytes; null: glibc's own)", mmap_threshold,
                               *MMAP_THRESHOLD_RANGE)
        check_whole_number("ReturnFreedMemory min_tokens", min_tokens, 0)
        self.every, self.mmap_threshold, self.min_tokens = every, mmap_threshold, min_tokens
        self.since = 0  # batches since the last trim
        self.largest = 0  # the largest batch (texts × padded length) since the last trim

    def setup(self, trainer, pl_module, stage):
        mallopt(M_TRIM_THRESHOLD, GLIBC_TRIM_THRESHOLD)
        if self.mmap_threshold:
            map_large_blocks(self.mmap_threshold)

    def trim(self) -> None:
        return_freed_memory()
        self.since = self.largest = 0

    def before(self, batch) -> None:
        ids = batch.get("input_ids") if isinstance(batch, dict) else None
        size = ids.numel() if ids is not None else 0
        if size >= self.min_tokens and (self.since >= self.every or size > self.largest > 0):
            self.trim()
        self.since += 1
        self.largest = max(self.largest, size)

    def on_train_epoch_start(self, trainer, pl_module):
        self.trim()

    def on_validation_epoch_start(self, trainer, pl_module):
        self.trim()

    def on_validation_end(self, trainer, pl_module):  # what validation and the monitor's figures left
        self.trim()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before(batch)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.before(batch)
