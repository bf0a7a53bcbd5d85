"""Reading a checkpoint that train.py wrote, safely: for training (resume, validate, test) and inference alike.

A checkpoint holds each fact once:
    hyper_parameters["network"]      the NetworkConfig (model/config.py, network_config): vocab_size, num_classes, ...
    hyper_parameters["label_names"]  the class names, index = class id
    state_dict                       the weights, keys prefixed "model."
    TextDataModule["tokenizer"]      the tokenizer's JSON, without truncation (texts are cut to the network's
                                     max_length by whoever encodes them)
(plus what Lightning keeps to resume: optimizer, schedule, loops, callbacks, and the data settings as given,
"datamodule_hyper_parameters", which loading never reads). This is the only layout read: a file of an earlier layout
(network settings flat in hyper_parameters, label names or max_length beside the tokenizer) is refused in one line
naming the version of the project that reads it (OLDER_LAYOUT).

Read with `torch.load(weights_only=True)` only, so a file from a stranger cannot run code; anything that is not such
a checkpoint raises CheckpointError with one line naming the file and what is wrong. Plain PyTorch, nothing of the
network: imported by data/ (a pretraining checkpoint's tokenizer), training/ and inference/ alike.

A run folder (lightning_logs/version_N, or its checkpoints/) stands for its best checkpoint (`best_checkpoint`): every
face finds and reads a checkpoint here (`open_checkpoint`), and its errors are this module's CheckpointError.
"""

import ast
import pickle
import zipfile
from pathlib import Path

import torch


class CheckpointError(ValueError):
    """The file is missing, unreadable, unsafe, or not a checkpoint of this project."""


def read_checkpoint(path) -> dict:
    """The checkpoint dict of a classifier, read safely; CheckpointError (one line, naming the file) on anything
    else."""
    checkpoint = load_safely(path)
    data = checkpoint.get("TextDataModule")
    if not isinstance(data, dict) and isinstance(checkpoint.get(PRETRAINING_DATA), dict):
        raise CheckpointError(f"{path}: a pretraining checkpoint (train.py pretrain), not a classifier: fine-tune a "
                              f"classifier from it with `train.py fit --model.init_from {path}`")
    if not isinstance(data, dict) or not isinstance(data.get("tokenizer"), str):
        raise CheckpointError(f"{path}: no tokenizer (the 'TextDataModule' entry train.py saves is missing or incomplete)")
    check_layout(path, checkpoint)
    if not stored_label_names(checkpoint):
        raise CheckpointError(f"{path}: no label names (hyper_parameters 'label_names' is empty)")
    stored_calibration(checkpoint, path)
    return checkpoint


# The last version of this project that reads the earlier layouts (pyproject.toml's `version`).
OLDER_LAYOUT = "version 0.1.0 of this project"


def check_layout(path, checkpoint: dict) -> None:
    """CheckpointError (one line) unless the network settings and the label names are in hyper_parameters and the
    tokenizer alone under "TextDataModule": earlier layouts kept the settings flat, or copies beside the tokenizer."""
    hparams = checkpoint["hyper_parameters"]
    if not isinstance(hparams.get("network"), dict) or "label_names" not in hparams \
            or set(checkpoint["TextDataModule"]) != {"tokenizer"}:
        raise CheckpointError(f"{path}: a checkpoint of an earlier layout (this version reads 'network' and "
                              f"'label_names' from hyper_parameters, only the tokenizer from 'TextDataModule'); "
                              f"{OLDER_LAYOUT} reads it")


PRETRAINING_DATA = "PretrainDataModule"  # where Lightning saves the pretraining DataModule's state (its class name)


def read_pretraining_checkpoint(path) -> dict:
    """A checkpoint written by `train.py pretrain`, read safely: hyper_parameters (network, objective), the
    encoder's weights, and the tokenizer under PRETRAINING_DATA; CheckpointError (one line) on anything else."""
    checkpoint = load_safely(path)
    if isinstance(checkpoint.get("TextDataModule"), dict):
        raise CheckpointError(f"{path}: a classifier checkpoint, not a pretraining one: --model.init_from takes a "
                              "checkpoint written by `train.py pretrain` (to continue this classifier's training, "
                              "give it as --ckpt_path)")
    data, hparams = checkpoint.get(PRETRAINING_DATA), checkpoint["hyper_parameters"]
    if not isinstance(data, dict) or not isinstance(data.get("tokenizer"), str) or "objective" not in hparams \
            or not isinstance(hparams.get("network"), dict):
        raise CheckpointError(f"{path}: not a pretraining checkpoint of this project (no tokenizer, network and "
                              "objective as `train.py pretrain` writes them)")
    return checkpoint


def load_safely(path) -> dict:
    """A checkpoint file of this project's layout (state_dict, hyper_parameters), read with weights_only."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: file not found")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    with open(path, "rb") as file:
        head = file.read(4)
    if not head:
        raise CheckpointError(f"{path}: empty file, not a checkpoint")
    if head == b"PK\x03\x04" and not zipfile.is_zipfile(path):  # torch.save writes a zip archive
        raise CheckpointError(f"{path}: truncated or damaged: the archive has no end (central directory)")
    if head[:1] == b"\x80":  # a pickle protocol marker: pickle.dump output, or torch's pre-1.6 format
        raise CheckpointError(f"{path}: a plain pickle file, not a checkpoint written by train.py (a zip archive); "
                              "it is not loaded, since unpickling can run code")
    if head != b"PK\x03\x04":
        raise CheckpointError(f"{path}: not a checkpoint written by train.py (not a zip archive)")
    try:
        # map_location="cpu": a checkpoint saved on a GPU loads on a machine without one; moved to the device later.
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only refuses anything but tensors and plain data; torch's message names what it refused.
        details = [line.strip() for line in str(e).splitlines() if line.strip()]
        refused = next((line for line in details if "GLOBAL" in line or "global" in line), None)
        if refused:
            raise CheckpointError(
                f"{path}: refused to load: it holds objects other than tensors and plain data, "
                f"which could run code ({refused})"
            ) from e
        reason = next((line for line in details if line.startswith("Unsupported")), details[-1] if details else "")
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint (corrupt?): {reason}") from e
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint (truncated or corrupt?): {reason}") from e
    if not isinstance(checkpoint, dict):
        kind = type(checkpoint).__name__
        raise CheckpointError(f"{path}: not a checkpoint of this project: holds a {kind}, not a dict")
    missing = [key for key in ("state_dict", "hyper_parameters") if not isinstance(checkpoint.get(key), dict)]
    if missing:
        raise CheckpointError(f"{path}: not a checkpoint of this project: missing {', '.join(map(repr, missing))}")
    return checkpoint


def stored_label_names(checkpoint: dict) -> list[str]:
    """The class names, index = class id."""
    return list(checkpoint["hyper_parameters"].get("label_names") or [])


# A temperature train.py fits lies in this range (training/calibration.py's fit_temperature falls back to 1 outside
# it); outside it every answer is near-certain (below) or near-uniform (above), so a stored one there is refused.
TEMPERATURE_RANGE = (1e-2, 1e2)


def stored_calibration(checkpoint: dict, path="checkpoint") -> tuple[float, list[float] | None]:
    """(temperature, thresholds or None) the checkpoint's "calibration" entry holds, checked: the temperature a finite
    number in TEMPERATURE_RANGE, the thresholds empty or one number in [0, 1] per label. No entry (a checkpoint
    written before calibration): temperature 1, no thresholds (0.5 each). CheckpointError (one line naming the file,
    the field and the value) on anything else: every face reads calibration through here."""
    stored = checkpoint.get("calibration")
    if stored is None:
        return 1.0, None
    if not isinstance(stored, dict):
        raise CheckpointError(f"{path}: 'calibration' is {stored!r:.80}, not a dict of temperature and thresholds")
    low, high = TEMPERATURE_RANGE
    temperature = stored.get("temperature", 1.0)
    if not _is_number(temperature) or not low <= temperature <= high:  # NaN fails both comparisons
        raise CheckpointError(f"{path}: calibration 'temperature' is {temperature!r:.80}: need a finite number in "
                              f"[{low:g}, {high:g}] (what train.py fits)")
    thresholds = stored.get("thresholds")
    thresholds = [] if thresholds is None else thresholds
    labels = stored_label_names(checkpoint)
    if not isinstance(thresholds, (list, tuple)) or len(thresholds) not in (0, len(labels)):
        raise CheckpointError(f"{path}: calibration 'thresholds' is {thresholds!r:.80}: need one number in [0, 1] per "
                              f"label ({len(labels)} labels), or none")
    for name, cut in zip(labels, thresholds):
        if not _is_number(cut) or not 0 <= cut <= 1:
            raise CheckpointError(f"{path}: calibration 'thresholds' of label {name!r} is {cut!r:.80}: need a "
                                  "number in [0, 1]")
    return float(temperature), [float(cut) for cut in thresholds] or None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def network_weights(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The network's weights named as in the network: the state_dict's "model." entries (the LightningModule's
    `model`), prefix removed; anything else the module saved (an EMA run's online_model) stays behind."""
    prefix = "model."
    return {key[len(prefix):]: value for key, value in checkpoint["state_dict"].items() if key.startswith(prefix)}


# ---- a run folder's best checkpoint ----------------------------------------------------------------------------------


def recorded_score(checkpoint: dict, name: str) -> tuple[float, str] | None:
    """(value, mode) of the monitored metric that ModelCheckpoint recorded for the file `name` when it saved it
    (its `best_k_models` entry; mode "max" or "min"), or None when no monitored ModelCheckpoint recorded one
    (last.ckpt, a pruned or hand-written checkpoint)."""
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if not key.startswith("ModelCheckpoint{") or not isinstance(state, dict) or not state.get("monitor"):
            continue
        # The callback's state holds no mode; its state key does: the class name, then the repr of its settings
        # (Callback._generate_state_key), "ModelCheckpoint{'monitor': 'val/acc', 'mode': 'max', ...}".
        mode = ast.literal_eval(key.removeprefix("ModelCheckpoint")).get("mode", "min")
        for saved, value in (state.get("best_k_models") or {}).items():
            if Path(saved).name == name:  # names, not paths: the run folder may have moved since
                return float(value), mode
    return None


def best_checkpoint(folder) -> Path:
    """The checkpoint of a run folder (lightning_logs/version_N, or its checkpoints/) with the best value of the
    metric its ModelCheckpoint monitored, as recorded inside each file (not its name or date: `epoch10` sorts
    before `epoch9`, and a copied file is newer than it was); the later step wins a tie. No file with a recorded
    value: last.ckpt. CheckpointError when there is neither."""
    return best_in(folder)[0]


def best_in(folder) -> tuple[Path, dict]:
    """best_checkpoint's file and its dict, each file of the folder read once."""
    folder = Path(folder)
    folder = folder / "checkpoints" if (folder / "checkpoints").is_dir() else folder
    best, modes = None, set()  # best: (sort key, path, checkpoint)
    for path in sorted(folder.glob("*.ckpt")):
        checkpoint = read_checkpoint(path)
        recorded = recorded_score(checkpoint, path.name)
        if recorded is None:
            continue
        value, mode = recorded
        modes.add(mode)
        key = (value if mode == "max" else -value, checkpoint.get("global_step", 0))
        if best is None or key > best[0]:
            best = (key, path, checkpoint)
    if len(modes) > 1:
        raise CheckpointError(f"{folder}: its checkpoints monitored metrics in both modes (max and min); "
                              "give one checkpoint file")
    if best is not None:
        return best[1], best[2]
    if (folder / "last.ckpt").is_file():
        return folder / "last.ckpt", read_checkpoint(folder / "last.ckpt")
    raise CheckpointError(f"{folder}: no checkpoint with a recorded validation score and no last.ckpt "
                          "(give a checkpoint file or a run folder)")


def resolve_checkpoint(path) -> Path:
    """A checkpoint file as it is; a run folder or its checkpoints/ folder: its best checkpoint (best_checkpoint)."""
    path = Path(path)
    return best_checkpoint(path) if path.is_dir() else path


def open_checkpoint(path) -> tuple[Path, dict]:
    """A classifier checkpoint file, or a run folder's best checkpoint, and its dict: found and read once."""
    path = Path(path)
    return best_in(path) if path.is_dir() else (path, read_checkpoint(path))


def calibrated(logits: torch.Tensor, multi_label: bool, temperature: float) -> torch.Tensor:
    """The probabilities every face gives (predict, serve, the ensemble's members, the explanations and their page,
    the ONNX export, the Lightning module's figures), (B, C) of logits (B, C): a sigmoid per label (several labels
    a text), or softmax(logits / temperature), the temperature fitted on validation (training/calibration.py)."""
    if multi_label:
        return logits.float().sigmoid()
    return (logits.float() / temperature).softmax(dim=-1)
