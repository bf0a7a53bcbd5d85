"""A run's folder (lightning_logs/version_N) as train.py keeps it: a command given one of the run's checkpoints works
in that run's folder, the fit's config.yaml stays the fit's, a given test file is scored at the end of the fit, and a
full disk under TensorBoard's writer thread names its file.

    version_of("lightning_logs/version_3/checkpoints/last.ckpt", Path("lightning_logs"))  # "version_3"
"""

import logging
import threading
from pathlib import Path

from lightning.pytorch.cli import SaveConfigCallback

log = logging.getLogger("train")


def version_of(ckpt_path, runs: Path) -> str | None:
    """The version folder (version_N) of `runs` that holds the checkpoint `ckpt_path` in its checkpoints/, else None.
    Resuming from it, or testing it, logs into that run: its best checkpoint and score carry over (Lightning restores
    them only into the same folder), and no new version_N is made beside it."""
    path = Path(ckpt_path).resolve()
    folder = path.parent.parent
    if path.parent.name == "checkpoints" and folder.name.startswith("version_") and folder.parent == runs.resolve():
        return folder.name
    return None


class SaveRunConfig(SaveConfigCallback):
    """config.yaml records how the run was trained: a validate, test or predict working in an existing run's folder
    leaves the fit's config.yaml as it is (its own settings, such as ckpt_path, are not a fit's)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        log_dir = trainer.log_dir
        if stage != "fit" and log_dir and (Path(log_dir) / self.config_filename).exists():
            return
        super().setup(trainer, pl_module, stage)


def test_after_fit(cli) -> None:
    """fit with data.test_file: the test file scored at the end, with the best checkpoint (or, with no best one, the
    final weights), in the same run (its TensorBoard events and the log)."""
    data = cli.datamodule
    if not getattr(data, "hparams", {}).get("test_file") or "test" not in data.state["splits"]:
        return
    best = next((c for c in cli.trainer.checkpoint_callbacks if c.monitor and c.best_model_path), None)
    if best is not None:
        log.info("scoring the test file %s with the best checkpoint %s", data.hparams.test_file, best.best_model_path)
    else:
        log.info("scoring the test file %s with the final weights (no best checkpoint: no validation)",
                 data.hparams.test_file)
    cli.trainer.test(cli.model, datamodule=data, ckpt_path=best.best_model_path if best else None, verbose=True)


def name_writer_errors() -> None:
    """TensorBoard writes its event file from a thread: a full disk there printed the thread's traceback, then the
    run stopped on the same error, which names no file. The thread's OSError is given the event file's name and its
    traceback is left out: train.py reports the error once, in one line (wait_for_writer)."""
    if getattr(threading.excepthook, "names_writer_errors", False):
        return
    previous = threading.excepthook

    def hook(args):
        if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
            if args.exc_value.filename is None:
                args.exc_value.filename = event_file(args.thread)
            return
        previous(args)

    hook.names_writer_errors = True
    threading.excepthook = hook


def event_file(thread) -> str | None:
    name = getattr(getattr(getattr(thread, "_record_writer", None), "_writer", None), "filename", None)
    return name.decode(errors="replace") if isinstance(name, bytes) else name


def wait_for_writer(error: OSError) -> None:
    """Let a writer thread that failed with `error` finish, so that the error carries its file's name."""
    for thread in threading.enumerate():
        if type(thread).__name__ == "_AsyncWriterThread" and getattr(thread, "exception", None) is error:
            thread.join(timeout=5)
