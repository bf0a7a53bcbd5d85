"""How long a fit trains when the config leaves trainer.max_epochs and trainer.max_steps unset: at least MIN_EPOCHS
passes over the data and at least MIN_STEPS optimizer steps (a small dataset gets more epochs: 10k news texts need ~20
epochs, not 5), at most MAX_EPOCHS. Early stopping ends it sooner once the monitored figure stops improving; it also
waits at least PATIENCE_STEPS optimizer steps without a better one (early_stopping.patience is raised to the epochs
that cover them): 1,000 texts are 15 steps an epoch, and 5 epochs stopped SST-2 subsets before they had learned
(docs/RESULTS.md "Small data").

    training_epochs(3600, batch_size=64, accumulate=1, stopping=None, stopper=None)  # 36: 57 steps an epoch
"""

import logging
import math

log = logging.getLogger("train")

MIN_EPOCHS, MIN_STEPS, MAX_EPOCHS = 5, 2000, 40
PATIENCE_STEPS = 300


def training_epochs(texts: int, batch_size: int, accumulate: int, stopping: dict | None, stopper) -> int:
    """max_epochs for `texts` training texts; early stopping's patience in epochs raised to cover PATIENCE_STEPS
    optimizer steps, both in the config's `stopping` section (written into config.yaml) and the `stopper` callback
    already built from it."""
    batches = math.ceil(texts / batch_size)
    steps = max(1, batches // (accumulate or 1))  # per epoch, one process
    epochs = min(MAX_EPOCHS, max(MIN_EPOCHS, math.ceil(MIN_STEPS / steps)))
    if stopping and stopper is not None:
        # At most half the run, so a small file that has learned stops before max_epochs.
        wanted = min(math.ceil(PATIENCE_STEPS / steps), epochs // 2)
        stopping["patience"] = stopper.patience = max(stopping["patience"], wanted)
    log.info("max_epochs %d: at least %d epochs and %d optimizer steps (%d per epoch), at most %d epochs%s", epochs,
             MIN_EPOCHS, MIN_STEPS, steps, MAX_EPOCHS,
             f"; early stopping after {stopping['patience']} epochs without a better {stopping['monitor']} "
             f"({stopping['patience'] * steps} steps)" if stopping else "")
    return epochs
