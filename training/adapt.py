"""The training side of model/threads.py's adapt(): at every batch of every loop (fit, validate, test, predict), the
pool may shrink to the cores other programs leave free, or grow back (it looks at most once a second)."""

from lightning.pytorch import Callback

from model.threads import adapt


class AdaptThreads(Callback):
    def on_train_batch_start(self, *args, **kwargs):
        adapt()

    on_validation_batch_start = on_test_batch_start = on_predict_batch_start = on_train_batch_start
