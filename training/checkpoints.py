"""Checks on a checkpoint handed to train.py (resume, validate, test, predict), made before anything is written,
and the upgrade of a checkpoint from the first layout:

    python -m training.checkpoints upgrade old.ckpt new.ckpt
"""

import sys
from pathlib import Path

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from data.files import WriteError, check_target, write_atomically
from inference.classifier import CheckpointError, network_config, read_checkpoint

SPECIAL_NAMES = ("last", "best", "hpc", "registry")  # Lightning resolves these itself


def check_readable(ckpt_path: str | None) -> None:
    """A named checkpoint file must be safe to read (weights_only) and in this version's layout."""
    if not ckpt_path or ckpt_path in SPECIAL_NAMES:
        return
    checkpoint = read_checkpoint(ckpt_path)
    if "pytorch-lightning_version" not in checkpoint:  # Lightning needs it to restore anything
        raise CheckpointError(f"{ckpt_path}: not written by train.py (no 'pytorch-lightning_version'), so train.py "
                              "cannot restore it; predict.py and TextClassifier.from_checkpoint read it")
    if "network" not in checkpoint["hyper_parameters"]:
        raise CheckpointError(
            f"{ckpt_path}: written before the network settings moved under 'network'; predict.py reads it as it is, "
            f"train.py needs it upgraded first: python -m training.checkpoints upgrade {ckpt_path} <new.ckpt>"
        )


def upgrade(source: str, target: str) -> None:
    """Write `target`: `source` with its flat network settings moved under hyper_parameters["network"]. The target
    is checked before anything is read (not a directory, not the source, writable) and written atomically."""
    check_target(target, "upgraded checkpoint", inputs=[source])
    checkpoint = read_checkpoint(source)
    hparams = checkpoint["hyper_parameters"]
    if "network" in hparams:
        raise CheckpointError(f"{source}: already in the current layout")
    labels = list(checkpoint["TextDataModule"]["label_names"])
    network = network_config(hparams, labels).to_dict()
    checkpoint["hyper_parameters"] = {k: v for k, v in hparams.items() if k not in network} | {"network": network}
    write_atomically(target, lambda path: torch.save(checkpoint, path), "upgraded checkpoint", inputs=[source])


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
    if ckpt_path is None or ckpt_path in ("best", "hpc", "registry"):
        return None
    if ckpt_path == "last":
        log_dir = getattr(trainer.logger, "log_dir", None) if trainer.logger else None
        last = Path(log_dir) / "checkpoints" / "last.ckpt" if log_dir else None
        return last if last is not None and last.exists() else None
    return Path(ckpt_path)


def check_checkpoint(ckpt_path: str | None, trainer, module, datamodule, resume: bool = False) -> dict | None:
    """The checkpoint (None if there is none to load); CheckpointError (one line, naming the file) unless it is
    safe to load (weights_only), was trained with this network and these label names, and (resume: fit) holds the
    training state to resume from."""
    path = resolve(ckpt_path, trainer)
    if path is None:
        return None
    check_readable(str(path))
    checkpoint = read_checkpoint(path)
    if resume and not checkpoint.get("optimizer_states"):
        raise CheckpointError(
            f"{path}: holds the weights only, no optimizer state (e.g. written by bench/prune_heads.py), so training "
            f"cannot resume from it; use it with predict.py or train.py validate/test --ckpt_path {path}, "
            "or resume from the checkpoint it was made from"
        )
    labels = list(checkpoint["TextDataModule"]["label_names"])
    try:
        trained = network_config(checkpoint["hyper_parameters"], labels)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from e
    hint = "use the config it was trained with (its run's config.yaml: --config <run>/config.yaml)"
    if labels != list(datamodule.label_names):
        raise CheckpointError(f"{path}: trained on label names {labels}, but this data has "
                              f"{list(datamodule.label_names)}; {hint}")
    differences = [
        f"{name} {value!r} (this config: {getattr(module.network, name)!r})"
        for name, value in trained.to_dict().items()
        if getattr(module.network, name) != value
    ]
    if differences:
        raise CheckpointError(f"{path}: trained with {', '.join(differences)}; {hint}")
    return checkpoint


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "upgrade":
        sys.exit("usage: python -m training.checkpoints upgrade OLD.ckpt NEW.ckpt")
    try:
        upgrade(argv[1], argv[2])
    except (CheckpointError, WriteError) as e:
        sys.exit(f"error: {e}")
    print(f"wrote {argv[2]}")


if __name__ == "__main__":
    main()
