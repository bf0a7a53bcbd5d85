"""Predictions from a checkpoint, without Lightning: texts in → labels, probabilities and (on request) attention.

    from inference import TextClassifier
    classifier = TextClassifier.from_checkpoint("lightning_logs/version_0/checkpoints/last.ckpt")
    classifier.predict(["a charming and affecting journey"])[0].label

A checkpoint is self-contained: the network's settings and label names (hyper_parameters), its weights
(state_dict) and the tokenizer (under "TextDataModule"), each stored once (data/checkpoint.py, which reads it safely:
anything that is not such a checkpoint raises CheckpointError with one line naming the file and what is wrong).
"""

from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from data.tokenizer import CHARS_PER_TOKEN_BOUND, UNK_ID, cut, pad
from data.checkpoint import (TEMPERATURE_RANGE, CheckpointError, calibrated, network_weights, open_checkpoint,
                             stored_calibration, stored_label_names)
from inference.limits import IG_STEPS_DEFAULT, PREDICT_BATCH
from inference.texts import COUNT_CHARACTERS, check_texts
from model.classifier import AttentionClassifier
from model.config import network_config
from model.errors import ConfigError
from model.own_attention import ALLOW_CHANGED, named_network
from model.threads import adapt
from monitor.views import stacked_layers

__all__ = ["Prediction", "TextClassifier"]

API_FLAGS = ("attention=", "allow_changed=True")  # how TextClassifier.from_checkpoint's error lines name its arguments
FACE_FLAGS = ("--attention-class", "--allow-changed-class")  # predict.py, serve.py, export.py, prune.py


def named_hyper_parameters(path, checkpoint: dict, attention: str | None, allow_changed: bool = False,
                           flags: tuple[str, str] = API_FLAGS) -> dict:
    """The checkpoint's hyper_parameters with the user's class, when its network has one, named by `attention`
    (model/own_attention/naming.py's named_network: the class's name and its file's hash checked; nothing the checkpoint
    names is imported); CheckpointError (one line naming the file, the class and the flag) otherwise."""
    hparams = checkpoint["hyper_parameters"]
    network = hparams.get("network")
    if not isinstance(network, dict):
        return hparams
    flag, override = flags
    try:
        return hparams | {"network": named_network(network, attention, flag=flag, allow_changed=allow_changed,
                                                   override=f"give {override} (or set {ALLOW_CHANGED}=1)")}
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None


@dataclass
class Prediction:
    text: str
    label: str
    probabilities: dict[str, float]  # label name → probability; label order, or the top k most likely first
    tokens: list[str] | None = None  # the tokens the model saw, when attention was asked for
    attention: torch.Tensor | None = None  # (n_layers, H, n, n) over those n tokens, when asked for; (n_layers, H, n, K)
    # in a long kind's key layout (README "Long texts"), whose columns attention_keys names
    truncated_from: int | None = None  # the text's own length in tokens when it was cut to max_length, else None
    # (counted on its first COUNT_CHARACTERS characters: a lower bound past those, see length_is_lower_bound)
    attention_keys: torch.Tensor | None = None  # long kinds: (n, K) the token of each column; -1 a projected key
    global_attention: torch.Tensor | None = None  # sparse: (n_layers, H, g, n) the global tokens' rows
    labels: list[str] | None = None  # several labels a text: those whose probability reaches their threshold, most
    # probable first (possibly none); `label` then names them joined by ", "

    def to_dict(self, all_heads: bool = False, decimals: int = 6, attention: bool = True) -> dict:
        """JSON-ready; attention is averaged over heads unless all_heads, and rounded to `decimals`. attention=False
        leaves out every attention field (tokens, weights, a long kind's key columns and global weights) even when
        they were computed (predict.py --attention-png draws them without printing them)."""
        out = {"text": self.text, "label": self.label, "probabilities": self.probabilities}
        if self.labels is not None:
            out["labels"] = self.labels
        if self.truncated_from is not None:
            out["truncated_from"] = self.truncated_from
        if not attention:
            return out
        if self.tokens is not None:
            out["tokens"] = self.tokens
        if self.attention is not None:
            weights = self.attention if all_heads else self.attention.mean(dim=1)  # (n_layers, [H,] n, n)
            out["attention"] = weights.double().round(decimals=decimals).tolist()  # double: no float32 digits noise
        if self.attention_keys is not None:
            out["attention_keys"] = self.attention_keys.tolist()
        if self.global_attention is not None:
            weights = self.global_attention if all_heads else self.global_attention.mean(dim=1)
            out["global_attention"] = weights.double().round(decimals=decimals).tolist()
        return out


def resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda asked for, but CUDA is not available on this machine (use --device cpu or auto)")
    return device


class TextClassifier:
    """A trained network with its tokenizer, loaded once; `predict` turns texts into Predictions."""

    def __init__(self, model: AttentionClassifier, tokenizer: Tokenizer, label_names: list[str], device="cpu",
                 multi_label: bool = False, temperature: float = 1.0, thresholds: list[float] | None = None):
        """multi_label: a sigmoid per label, the answer the labels reaching `thresholds` (default 0.5 each);
        else a softmax of the logits divided by `temperature` (both fitted on validation: training/calibration.py)."""
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        self.label_names = list(label_names)
        self.multi_label, self.temperature = multi_label, float(temperature)
        # Explanations read both (inference/explain.py): they explain the probabilities predict gives.
        self.model.multi_label, self.model.temperature = multi_label, self.temperature
        self.thresholds = [float(cut) for cut in thresholds] if thresholds else [0.5] * len(self.label_names)
        low, high = TEMPERATURE_RANGE  # the rule a checkpoint's stored calibration is read by (data/checkpoint.py)
        if len(self.thresholds) != len(self.label_names) or not low <= self.temperature <= high \
                or not all(0 <= cut <= 1 for cut in self.thresholds):
            raise ValueError(f"thresholds {self.thresholds} for {len(self.label_names)} labels, temperature "
                             f"{self.temperature}: need one threshold in [0, 1] a label and a temperature in "
                             f"[{low:g}, {high:g}]")
        # Texts are cut to the network's max_length here rather than by the tokenizer, so the full length of a cut
        # text is known (a tokenizer handed in, as train_tokenizer makes one, may carry a truncation).
        self.max_length = model.max_length
        # What the attention doctor last said of this network in training (inference/verdicts.py), when it was
        # loaded from a checkpoint that carries it: the explanation page's badges.
        self.verdicts: dict | None = None
        tokenizer.no_truncation()
        self.tokenizer = tokenizer

    @classmethod
    def from_checkpoint(cls, path, device: str | torch.device = "auto", checkpoint: dict | None = None,
                        attention: str | None = None, allow_changed: bool = False,
                        flags: tuple[str, str] = API_FLAGS) -> "TextClassifier":
        """The classifier of a checkpoint file or of a run folder (its best checkpoint). `checkpoint`: the file's
        dict when the caller has read it already (data/checkpoint.py's open_checkpoint), so it is read once.

        attention: a network of a user's own class needs it named, "path/to/file.py:ClassName" as in training:
        a checkpoint never imports code by itself (docs/BAD_INPUT.md). The file's sha256 must equal the one the
        checkpoint records, unless allow_changed. flags: how the caller spells `attention` and `allow_changed` in
        its error lines (a face's --attention-class, --allow-changed-class)."""
        if checkpoint is None:
            path, checkpoint = open_checkpoint(path)
        labels = stored_label_names(checkpoint)
        try:
            tokenizer = Tokenizer.from_str(checkpoint["TextDataModule"]["tokenizer"])
        except Exception as e:  # the Rust tokenizer raises a plain Exception on bad JSON
            raise CheckpointError(f"{path}: the tokenizer saved in the checkpoint is unreadable: {e}") from e
        hparams = named_hyper_parameters(path, checkpoint, attention, allow_changed, flags)
        try:
            model = AttentionClassifier(network_config(hparams, labels))
        except ConfigError as e:  # the user's class: built, probed; one line naming it
            raise CheckpointError(f"{path}: {e}") from e
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: hyper_parameters do not describe a valid network: {e}") from e
        try:
            model.load_state_dict(network_weights(checkpoint))
        except RuntimeError as e:
            reason = " ".join(str(e).split())[:300]
            raise CheckpointError(
                f"{path}: weights do not fit the network its hyper_parameters describe: {reason}"
            ) from e
        from inference.verdicts import latest_verdicts

        temperature, thresholds = stored_calibration(checkpoint, path)
        classifier = cls(model, tokenizer, labels, device=device, temperature=temperature, thresholds=thresholds,
                         multi_label=bool(checkpoint["hyper_parameters"].get("multi_label", False)))
        classifier.verdicts = latest_verdicts(checkpoint)
        return classifier

    def answer(self, probabilities: list[float]) -> tuple[str, list[str] | None]:
        """(label, labels) of one text's probabilities: the most likely class and None; several labels a text:
        those reaching their threshold, most probable first, and their names joined by ", "."""
        if not self.multi_label:
            return self.label_names[max(range(len(probabilities)), key=probabilities.__getitem__)], None
        chosen = sorted((i for i, p in enumerate(probabilities) if p >= self.thresholds[i]),
                        key=lambda i: -probabilities[i])
        labels = [self.label_names[i] for i in chosen]
        return ", ".join(labels), labels

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """Calibrated probabilities (B, C) of logits (B, C): sigmoid per label, or softmax(logits / temperature)."""
        return calibrated(logits, self.multi_label, self.temperature)

    def encode(self, texts: list[str]) -> tuple[list[list[int]], list[list[str]], list[int]]:
        """Token ids and tokens cut to max_length, and each text's own length in tokens. As in training, the ids
        come from the text's first max_length × CHARS_PER_TOKEN_BOUND characters (a huge line is never tokenized
        whole); a text longer than that is counted once more, on its first COUNT_CHARACTERS characters, so its
        length is the text's own (a lower bound only past COUNT_CHARACTERS: see length_is_lower_bound)."""
        texts = list(texts)
        ids, tokens, full_lengths = [], [], []
        for encoding in self.tokenizer.encode_batch(cut(texts, self.max_length)):
            # As in training (data/encoded.py): a text of only unknown symbols becomes one [UNK].
            text_ids, text_tokens = (encoding.ids, encoding.tokens) if encoding.ids else ([UNK_ID], ["[UNK]"])
            ids.append(text_ids[: self.max_length])
            tokens.append(text_tokens[: self.max_length])
            full_lengths.append(len(text_ids))
        cut_short = [i for i, text in enumerate(texts) if len(text) > self.max_length * CHARS_PER_TOKEN_BOUND]
        if cut_short:
            counted = self.tokenizer.encode_batch([texts[i][:COUNT_CHARACTERS] for i in cut_short])
            for i, encoding in zip(cut_short, counted):
                full_lengths[i] = max(full_lengths[i], len(encoding.ids))
        return ids, tokens, full_lengths

    @torch.inference_mode()
    def predict(
        self, texts: list[str], attention: bool = False, top_k: int | None = None, batch_size: int = PREDICT_BATCH
    ) -> list[Prediction]:
        """One Prediction per text, in input order. Texts are batched by length (little padding), then put back."""
        texts = check_texts(texts, "predict")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        heads = {block.attention.n_heads for block in self.model.blocks}
        if attention and len(heads) > 1:
            raise ValueError("attention weights are handed out as one (layers, heads, ...) tensor, but this pruned "
                             f"model's layers have different head counts ({sorted(heads)}); use explain() instead")
        ids, tokens, full_lengths = self.encode(texts)
        order = sorted(range(len(texts)), key=lambda i: len(ids[i]))
        predictions: list[Prediction | None] = [None] * len(texts)
        for start in range(0, len(order), batch_size):
            adapt()  # the pool's size to the cores other programs leave free (model/threads.py), once a second
            batch = order[start : start + batch_size]
            probabilities, (weights, keys, global_weights) = self._forward([ids[i] for i in batch], attention)
            for row, i in enumerate(batch):
                n = len(ids[i])
                rows = weights[row, :, :, :n] if attention else None  # (n_layers, H, n, L), or K columns of a long kind
                label, labels = self.answer(probabilities[row].tolist())
                predictions[i] = Prediction(
                    text=texts[i],
                    label=label, labels=labels,
                    probabilities=self._label_probabilities(probabilities[row].tolist(), top_k),
                    tokens=tokens[i] if attention else None,
                    attention=(rows[..., :n] if keys is None else rows).clone() if attention else None,
                    truncated_from=full_lengths[i] if full_lengths[i] > n else None,
                    attention_keys=keys[:n].clone() if keys is not None else None,
                    global_attention=global_weights[row, ..., :n, :n].clone() if global_weights is not None else None,
                )
        return predictions

    def explain(self, texts: list[str], ig_steps: int = IG_STEPS_DEFAULT) -> list:
        """Why each text got its label: per-token scores from five methods and their faithfulness figures
        (inference/explain.py; docs/EXPLAIN.md)."""
        from inference.explain import explain  # Captum only when explanations are asked for

        return explain(self, texts, ig_steps=ig_steps)

    def _forward(self, batch_ids: list[list[int]], attention: bool) -> tuple[torch.Tensor, tuple]:
        """Probabilities (B, num_classes) and, if asked, weights (B, n_layers, H, L, L) (a long kind: (B, n_layers,
        H, L, K), its key_positions (L, K) and sparse's global rows (B, n_layers, H, g, L)), all on the CPU."""
        input_ids, key_padding_mask = pad(batch_ids)  # (B, L) each; the mask from lengths, as in training
        # Length-sorted batches often have no padding at all; then there is nothing to mask.
        mask = key_padding_mask.to(self.device) if key_padding_mask.any() else None
        output = self.model(input_ids.to(self.device), mask, need_weights=attention)
        probabilities = self.probabilities(output.logits).cpu()  # (B, num_classes)
        if not attention:
            return probabilities, (None, None, None)
        return probabilities, stacked_layers(output.attention)  # each layer's own weights, in its kind's layout

    def _label_probabilities(self, probabilities: list[float], top_k: int | None) -> dict[str, float]:
        pairs = list(zip(self.label_names, probabilities))
        if top_k is not None:
            pairs = sorted(pairs, key=lambda pair: pair[1], reverse=True)[:top_k]
        return dict(pairs)
