"""Several checkpoints as one classifier: their class probabilities averaged, each text encoded by each checkpoint's
own tokenizer (they may differ in anything but their label names).

    from inference.ensemble import Ensemble
    ensemble = Ensemble.from_checkpoints(["run0/checkpoints/best.ckpt", "lightning_logs/version_1"])
    ensemble.predict(["a charming and affecting journey"])[0].label

A run folder (lightning_logs/version_N, or its checkpoints/) stands for its best checkpoint (data/checkpoint.py's
best_checkpoint).
"""

from data.checkpoint import CheckpointError
from inference.classifier import Prediction, TextClassifier
from inference.limits import PREDICT_BATCH


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
            member = TextClassifier.from_checkpoint(path, device=device)
            if members and member.label_names != members[0].label_names:
                raise CheckpointError(f"{path}: labels {member.label_names} differ from {paths[0]}'s "
                                      f"{members[0].label_names}; an ensemble averages the same classes")
            members.append(member)
        return cls(members)

    def predict(self, texts: list[str], attention: bool = False, top_k: int | None = None,
                batch_size: int = PREDICT_BATCH) -> list[Prediction]:
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
            labels = None
            if self.members[0].multi_label:  # several labels a text: each label's threshold averaged like its p
                cuts = [sum(m.thresholds[c] for m in self.members) / len(self.members) for c in range(len(average))]
                labels = sorted((name for name, cut in zip(self.label_names, cuts) if average[name] >= cut),
                                key=lambda name: -average[name])
                label = ", ".join(labels)
            if top_k is not None:
                average = dict(sorted(average.items(), key=lambda pair: pair[1], reverse=True)[:top_k])
            cut_from = [p[i].truncated_from for p in per_member if p[i].truncated_from is not None]
            predictions.append(Prediction(text=text, label=label, probabilities=average, labels=labels,
                                          truncated_from=max(cut_from) if cut_from else None))
        return predictions
