"""Train, validate, test or predict with a YAML config:

    python train.py fit --config configs/sst2.yaml
    python train.py fit --config configs/sst2.yaml --ckpt_path last      # resume an interrupted run
    python train.py validate --config configs/sst2.yaml --ckpt_path lightning_logs/version_0/checkpoints/last.ckpt

`python train.py fit --help` lists every option (data.*, model.*, trainer.*).
"""

import logging

import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger

from data import TextDataModule
from model.lightning_module import ClassifierModule


class CLI(LightningCLI):
    def add_arguments_to_parser(self, parser):
        # Sizes the data decides travel to the model; the user never types them twice.
        parser.link_arguments("data.max_length", "model.max_length")
        parser.link_arguments("data.num_tokens", "model.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.label_names", "model.label_names", apply_on="instantiate")


def main(args=None):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_float32_matmul_precision("high")
    return CLI(
        ClassifierModule,
        TextDataModule,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={
            "logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": ".", "name": "lightning_logs", "default_hp_metric": False},
            },
            "callbacks": [
                # Best by validation accuracy, plus last.ckpt for resuming.
                ModelCheckpoint(
                    monitor="val/acc", mode="max", save_last=True, auto_insert_metric_name=False,
                    filename="best-epoch{epoch}-step{step}-acc{val/acc:.4f}",
                ),
                LearningRateMonitor(logging_interval="step"),
            ],
        },
        args=args,
    )


if __name__ == "__main__":
    main()
