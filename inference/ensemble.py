"""Several checkpoints as one classifier: their class probabilities averaged, each text encoded by each checkpoint's
own tokenizer (they may differ in anything but their label names and layout: one label a text or several).

    from inference.ensemble import Ensemble
    ensemble = Ensemble.from_checkpoints(["run0/checkpoints/best.ckpt", "lightning_logs/version_1"])
    ensemble.predict(["a charming and affecting journey"])[0].label

A run folder (lightning_logs/version_N, or its checkpoints/) stands for its best checkpoint (data/checkpoint.py's
best_checkpoint).
"""

from data.checkpoint import CheckpointError, open_checkpoint
from inference.classifier import Prediction, TextClassifier
from inference.limits import PREDICT_BATCH
from model.kinds import find_kind


class Ensemble:
    """The average of several TextClassifiers' probabilities; predict() as TextClassifier's, without attention."""

    def __init__(self, members: list[TextClassifier], names: list | None = None):
        """names: what each member is called in an error (its checkpoint path); default "checkpoint i"."""
        if not members:
            raise ValueError("an ensemble needs at least one checkpoint")
        names = [str(name) for name in names] if names else [f"checkpoint {i}" for i in range(len(members))]
        for name, member in zip(names[1:], members[1:]):
            check_same_layout(name, member.label_names, member.multi_label, names[0], members[0].label_names,
                              members[0].multi_label)
        self.members = members
        self.label_names = members[0].label_names
        self.multi_label = members[0].multi_label
        self.max_length = min(member.max_length for member in members)  # for notes on truncated texts

    @property
    def thresholds(self) -> list[float]:
        """Several labels a text: each label's threshold averaged over the members, like its probability."""
        return [sum(m.thresholds[c] for m in self.members) / len(self.members) for c in range(len(self.label_names))]

    @classmethod
    def from_checkpoints(cls, paths, device="auto", attention: str | None = None, **named) -> "Ensemble":
        """named: TextClassifier.from_checkpoint's allow_changed and flags. attention: the user's class, for each
        member trained with one (a class named while no member has one is refused, by the first member)."""
        opened = [open_checkpoint(path) for path in paths]
        own = [getattr(find_kind(checkpoint["hyper_parameters"].get("network", {}).get("attention")), "names_code",
                       False) for _, checkpoint in opened]
        members = [TextClassifier.from_checkpoint(path, device=device, checkpoint=checkpoint,
                                                  attention=attention if uses or not any(own) else None, **named)
                   for (path, checkpoint), uses in zip(opened, own)]
        return cls(members, names=paths)

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
            if self.multi_label:  # several labels a text: each label's threshold averaged like its p
                cuts = self.thresholds
                labels = sorted((name for name, cut in zip(self.label_names, cuts) if average[name] >= cut),
                                key=lambda name: -average[name])
                label = ", ".join(labels)
            if top_k is not None:
                average = dict(sorted(average.items(), key=lambda pair: pair[1], reverse=True)[:top_k])
            cut_from = [p[i].truncated_from for p in per_member if p[i].truncated_from is not None]
            predictions.append(Prediction(text=text, label=label, probabilities=average, labels=labels,
                                          truncated_from=max(cut_from) if cut_from else None))
        return predictions


def check_same_layout(name, labels, multi_label: bool, first_name, first_labels, first_multi_label: bool) -> None:
    """CheckpointError (one line naming `name` and what differs) unless two models' probabilities can be averaged:
    the same label names, and both one label a text (a softmax over the labels) or both several (a sigmoid each)."""
    if list(labels) != list(first_labels):
        difference = f"labels {list(labels)} differ from the labels {list(first_labels)}"
    elif multi_label != first_multi_label:
        layout = {False: "one label a text (softmax)", True: "several labels a text (a sigmoid per label)"}
        difference = f"{layout[multi_label]} differs from {layout[first_multi_label]}"
    else:
        return
    raise CheckpointError(f"{name}: {difference} of {first_name}; an ensemble averages the same classes answered "
                          "the same way")
