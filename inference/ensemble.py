"""Several checkpoints as one classifier: their class probabilities averaged, each text encoded by each checkpoint's
own tokenizer (they may differ in anything but their label names).

    from inference.ensemble import Ensemble
    ensemble = Ensemble.from_checkpoints(["run0/checkpoints/best.ckpt", "lightning_logs/version_1"])
    ensemble.predict(["a charming and affecting journey"])[0].label

A run folder (lightning_logs/version_N, or its checkpoints/) stands for its best checkpoint: the one with the best
value of the monitored metric recorded inside the file (best_checkpoint).
"""

import ast
from pathlib import Path

from inference.classifier import CheckpointError, Prediction, TextClassifier, read_checkpoint


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
    folder = Path(folder)
    folder = folder / "checkpoints" if (folder / "checkpoints").is_dir() else folder
    scored = []  # (value, mode, step, path)
    for path in sorted(folder.glob("*.ckpt")):
        checkpoint = read_checkpoint(path)
        recorded = recorded_score(checkpoint, path.name)
        if recorded is not None:
            scored.append((*recorded, checkpoint.get("global_step", 0), path))
    if len({mode for _, mode, _, _ in scored}) > 1:
        raise CheckpointError(f"{folder}: its checkpoints monitored metrics in both modes (max and min); "
                              "give one checkpoint file")
    if scored:
        sign = 1 if scored[0][1] == "max" else -1
        return max(scored, key=lambda item: (sign * item[0], item[2]))[3]
    if (folder / "last.ckpt").is_file():
        return folder / "last.ckpt"
    raise CheckpointError(f"{folder}: no checkpoint with a recorded validation score and no last.ckpt "
                          "(give a checkpoint file or a run folder)")


def resolve_checkpoint(path) -> Path:
    """A checkpoint file as it is; a run folder or its checkpoints/ folder: its best checkpoint (best_checkpoint)."""
    path = Path(path)
    return best_checkpoint(path) if path.is_dir() else path


class Ensemble:
    """The average of several TextClassifiers' probabilities; predict() as TextClassifier's, without attention."""

    def __init__(self, members: list[TextClassifier]):
        if not members:
            raise ValueError("an ensemble needs at least one checkpoint")
        self.members = members
        self.label_names = members[0].label_names
        self.max_length = min(member.max_length for member in members)  # for notes on truncated texts

    @classmethod
    def from_checkpoints(cls, paths, device="auto") -> "Ensemble":
        members = []
        for path in paths:
            member = TextClassifier.from_checkpoint(resolve_checkpoint(path), device=device)
            if members and member.label_names != members[0].label_names:
                raise CheckpointError(f"{path}: labels {member.label_names} differ from {paths[0]}'s "
                                      f"{members[0].label_names}; an ensemble averages the same classes")
            members.append(member)
        return cls(members)

    def predict(self, texts: list[str], attention: bool = False, top_k: int | None = None,
                batch_size: int = 256) -> list[Prediction]:
        if attention:
            raise ValueError("attention belongs to one network: ask a single checkpoint, not an ensemble")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        per_member = [member.predict(texts, batch_size=batch_size) for member in self.members]
        predictions = []
        for i, text in enumerate(texts):
            average = {name: sum(p[i].probabilities[name] for p in per_member) / len(per_member)
                       for name in self.label_names}
            label = max(self.label_names, key=average.__getitem__)  # ties: the first label, as argmax
            if top_k is not None:
                average = dict(sorted(average.items(), key=lambda pair: pair[1], reverse=True)[:top_k])
            cut_from = [p[i].truncated_from for p in per_member if p[i].truncated_from is not None]
            predictions.append(Prediction(text=text, label=label, probabilities=average,
                                          truncated_from=max(cut_from) if cut_from else None))
        return predictions
