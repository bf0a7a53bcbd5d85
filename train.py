"""Train, validate, test or predict with a YAML config:

    python train.py fit --config configs/sst2.yaml
    python train.py fit                                                  # no config: configs/default.yaml, SST-2
    python train.py fit --config configs/sst2.yaml --ckpt_path last      # resume an interrupted run
    python train.py validate --config configs/sst2.yaml --ckpt_path lightning_logs/version_0/checkpoints/last.ckpt

`python train.py fit --help` lists every option (data.*, model.*, trainer.*, early_stopping.*). Without --config,
`fit` reads configs/default.yaml (the generic default) as its defaults.

Pretraining on unlabeled text (README "Pretraining on unlabeled text"), then fine-tuning from it:

    python train.py pretrain --config configs/pretrain.yaml --data.dataset chnsenticorp_htl \
        --data.unlabeled_files '[more.parquet]'
    python train.py fit --data.dataset chnsenticorp_htl --model.init_from <run>/checkpoints/last.ckpt

`pretrain` is `fit` of the pretraining system (training/pretraining.py, data/pretraining.py): the same options,
logs, checkpoints and `--ckpt_path last`; `python train.py pretrain --help` lists them.

Left unset, the sizes the data decide (data.max_length, data.vocab_size) and the training length
(trainer.max_epochs) are chosen at start, logged once, and written into the run's config.yaml, so a rerun from
that file is exact. Early stopping (on val/acc, or macro-F1 val/f1 when the classes are imbalanced or several a
text: data/labels.py) and the attention monitor are on by default.
"""

import errno
import logging
import sys
from pathlib import Path

import runtime

DESCRIPTION = """Train, validate, test or predict with a YAML config (Lightning's subcommands below), or pretrain:
`train.py pretrain` is fit of the pretraining system on unlabeled text (`train.py pretrain --help` lists its
options). `train.py SUBCOMMAND --help` lists a subcommand's options."""
PRETRAIN_DESCRIPTION = """train.py pretrain: pretrain the network on unlabeled text (the training split's texts and
data.unlabeled_files), for `train.py fit --model.init_from <run>/checkpoints/last.ckpt` (docs/PRETRAINING.md). The
options, logs, checkpoints and --ckpt_path last of fit; the usage line says fit because pretrain runs as it."""

ROOT = Path(__file__).resolve().parent
DEFAULT_CONFIG = ROOT / "configs" / "default.yaml"  # what `fit` reads first when no --config is given
PRETRAIN_CONFIG = ROOT / "configs" / "pretrain.yaml"  # and `pretrain`


def main(args=None):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("runtime").info(runtime.configure().describe())  # before torch loads: runtime.py
    import torch

    from data import DataError
    from data.checkpoint import CheckpointError
    from data.files import WriteError, reason
    from model.config import ConfigError
    from training.cli import wrapped_config_error
    from training.module import NonFiniteLossError
    from training.runs import name_writer_errors, wait_for_writer

    torch.set_float32_matmul_precision("high")
    name_writer_errors()
    try:
        return cli(args)
    except (DataError, ConfigError, CheckpointError, WriteError, NonFiniteLossError) as e:
        sys.exit(f"error: {e}")  # bad input: one line naming the file or setting, no traceback
    except torch.cuda.OutOfMemoryError:
        sys.exit("error: out of memory on the GPU; lower data.batch_size or data.max_length")
    except ValueError as e:  # jsonargparse wraps what a class's constructor raised (a callback's ConfigError)
        cause = wrapped_config_error(e)
        if cause is None:
            raise
        sys.exit(f"error: {cause}")
    except OSError as e:  # a log, checkpoint or cache folder that cannot be written: read-only (EROFS), no access, full
        wait_for_writer(e)
        what = (e.strerror or reason(e)).lower()
        unwritable = e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        hint = ("choose a writable --trainer.default_root_dir (logs and checkpoints) or --data.cache_dir" if unwritable
                else "nothing was saved past the last checkpoint")
        sys.exit(f"error: {e.filename or 'a file'}: {what}; {hint}")


def cli(args=None, run=True):
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    from data import TextDataModule
    from data.pretraining import PretrainDataModule
    from training.cli import ArgumentParser
    from training.commands import BEST_NAME, CLI, PretrainCLI
    from training.module import ClassifierModule
    from training.pretraining import PretrainModule
    from training.runs import SaveRunConfig

    args = list(sys.argv[1:] if args is None else args)  # handed to LightningCLI, which then reads no sys.argv
    pretrain = args[:1] == ["pretrain"]
    if pretrain:  # `fit` of the pretraining classes (no subcommand at all when not run)
        args = ["fit", *args[1:]] if run else args[1:]
    monitor, mode = ("val/loss", "min") if pretrain else ("val/acc", "max")
    parser_kwargs = {"description": DESCRIPTION, "fit": {"description": PRETRAIN_DESCRIPTION}} if pretrain else {
        "description": DESCRIPTION}
    if (args[:1] == ["fit"] or not run) and not any(arg == "--config" or arg.startswith("--config=") for arg in args):
        # No config: the generic default (configs/default.yaml; configs/pretrain.yaml for pretrain), so a run
        # without one gets its regularisation and distillation. `--print_config` shows what was read.
        defaults = {"default_config_files": [str(PRETRAIN_CONFIG if pretrain else DEFAULT_CONFIG)]}
        if run:
            parser_kwargs.setdefault("fit", {}).update(defaults)
        else:
            parser_kwargs.update(defaults)
    return (PretrainCLI if pretrain else CLI)(
        PretrainModule if pretrain else ClassifierModule,
        PretrainDataModule if pretrain else TextDataModule,
        parser_kwargs=parser_kwargs,
        parser_class=ArgumentParser,  # one-line config errors, no prefix matching of flags (training/cli.py)
        seed_everything_default=0,
        save_config_callback=SaveRunConfig,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={
            "use_distributed_sampler": False,  # BucketBatchSampler shards batches across processes itself
            # Checkpoints replaced whole or not at all (data/files.py); a class path, so config.yaml reruns.
            "plugins": [{"class_path": "training.checkpoints.AtomicCheckpointIO"}],
            "logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": ".", "name": "lightning_logs", "default_hp_metric": False},
            },
            "callbacks": [
                # Best by validation accuracy, and last.ckpt for resuming: its own callback, since Lightning's
                # save_last rewrites last.ckpt only in epochs that also saved a new best.
                ModelCheckpoint(
                    monitor=monitor, mode=mode, auto_insert_metric_name=False,
                    filename=BEST_NAME,
                ),
                ModelCheckpoint(filename="last", enable_version_counter=False),  # no monitor: the newest epoch
                LearningRateMonitor(logging_interval="step"),
            ],
        },
        args=args,
        run=run,
    )


if __name__ == "__main__":
    main()
