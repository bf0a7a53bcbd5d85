"""Checks on a checkpoint handed to train.py (resume, validate, test, predict), made before anything is written.

Not a command: `python -m training.checkpoints ...` says so in one line (exit status 2), since scripts may still call
the checkpoint upgrade that older versions had here.
"""

import sys
from pathlib import Path

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from data.files import write_atomically
from data.checkpoint import OLDER_LAYOUT, CheckpointError, stored_label_names
from model.config import NetworkConfig, network_config

SPECIAL_NAMES = ("last", "best", "hpc", "registry")  # Lightning resolves these itself


def check_restorable(path, checkpoint: dict) -> None:
    """train.py restores only what it wrote: Lightning needs its version stamp to restore anything."""
    if "pytorch-lightning_version" not in checkpoint:
        raise CheckpointError(f"{path}: not written by train.py (no 'pytorch-lightning_version'), so train.py "
                              "cannot restore it; predict.py and TextClassifier.from_checkpoint read it")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer through data/files.py: a checkpoint is replaced whole or not at all, so a run
    killed (or out of disk) while writing last.ckpt keeps the previous one, and the failure is one line."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if "://" in str(path):  # a remote filesystem (fsspec): Lightning's own writer
            return super().save_checkpoint(checkpoint, path, storage_options)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write = super().save_checkpoint
        write_atomically(path, lambda temporary: write(checkpoint, temporary, storage_options), "checkpoint")


def resolve(ckpt_path: str | None, trainer) -> Path | None:
    """The file `ckpt_path` names: a path, or "last" → the run's last.ckpt (None when there is none yet: a fresh
    start). Lightning's other special names ("best", "hpc", ...) are left to Lightning."""
    if ckpt_path == "last":
        log_dir = getattr(trainer.logger, "log_dir", None) if trainer.logger else None
        last = Path(log_dir) / "checkpoints" / "last.ckpt" if log_dir else None
        return last if last is not None and last.exists() else None
    return None if ckpt_path is None or ckpt_path in SPECIAL_NAMES else Path(ckpt_path)


def check_fits(path, checkpoint: dict, network, label_names, resume: bool = False) -> None:
    """CheckpointError (one line, naming the file) unless the checkpoint was trained with this network config and
    these label names (those of the data), and (resume: fit) holds the training state to resume from."""
    if resume and not checkpoint.get("optimizer_states"):
        raise CheckpointError(
            f"{path}: holds the weights only, no optimizer state (e.g. written by prune.py), so training "
            f"cannot resume from it; use it with predict.py or train.py validate/test --ckpt_path {path}, "
            "or resume from the checkpoint it was made from"
        )
    labels = stored_label_names(checkpoint)
    try:
        trained = network_config(checkpoint["hyper_parameters"], labels)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from e
    hint = "use the config it was trained with (its run's config.yaml: --config <run>/config.yaml)"
    if labels != list(label_names):
        raise CheckpointError(f"{path}: trained on label names {labels}, but this data has {list(label_names)}; {hint}")
    if differs := differences(trained, network):
        raise CheckpointError(f"{path}: trained with {differs}; {hint}")


def check_pretraining_fits(path, checkpoint: dict, network) -> None:
    """As check_fits, for a pretraining checkpoint (train.py pretrain --ckpt_path): no labels, the network alone."""
    if differs := differences(NetworkConfig.from_dict(checkpoint["hyper_parameters"]["network"]), network):
        raise CheckpointError(f"{path}: pretrained with {differs}; use the config it was trained with (its run's "
                              "config.yaml: --config <run>/config.yaml)")


def differences(trained: NetworkConfig, network: NetworkConfig) -> str:
    """What the checkpoint's network config `trained` sets otherwise than this config's `network`, as
    "name value (this config: value), ..."; "" when they agree."""
    return ", ".join(f"{name} {value!r} (this config: {getattr(network, name)!r})"
                     for name, value in trained.to_dict().items() if getattr(network, name) != value)


def main(argv=None) -> int:
    command = " ".join(["python -m training.checkpoints", *(sys.argv[1:] if argv is None else argv)])
    print(f"error: {command}: there is no such command: this version reads checkpoints of its own layout only "
          f"(train.py writes them); a checkpoint of an earlier layout is read by {OLDER_LAYOUT}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
