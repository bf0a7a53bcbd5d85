"""Which attention heads matter: importance, exact ablation, and pruning into a smaller checkpoint.

    importance    Michel et al. 2019 ("Are Sixteen Heads Really Better than One?"): a gate ξ_h = 1 multiplies each
                  head's output before W_O (MultiHeadSelfAttention.head_gate); the importance of a head is
                  Σ over batches |∂ loss / ∂ξ_h| (cross-entropy, batch mean), divided by the number of batches.
    ablation      exact: the gate set to 0 (the head removed), accuracy on the same texts measured again.
    pruning       a checkpoint with the chosen heads cut out of W_Q, W_K, W_V (rows) and W_O (columns);
                  NetworkConfig.layer_heads records the heads left per layer, so the checkpoint rebuilds exactly and
                  predict.py loads it. Every layer keeps at least one head.

prune.py runs all three over the checkpoint's own dataset split and writes the table and the checkpoint.
"""

import random
import re
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from data.reading import has_text
from data.tokenizer import pad
from inference.classifier import TextClassifier
from inference.explain import spearman
from inference.limits import PREDICT_BATCH
from inference.splits import checkpoint_split
from model.kinds import attention_kind


def batches(classifier, texts: list[str], labels: list[int], batch_size: int = PREDICT_BATCH):
    """(token_ids (B, L), key_padding_mask (B, L) or None, labels (B,)) over the texts, sorted by length."""
    ids, _, _ = classifier.encode(texts)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = []
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        token_ids, mask = pad([ids[i] for i in chunk])  # the mask from lengths, as in training
        out.append((token_ids.to(classifier.device), mask.to(classifier.device) if mask.any() else None,
                    torch.tensor([labels[i] for i in chunk], device=classifier.device)))
    return out


def attention_layers(model) -> list:
    return [block.attention for block in model.blocks]


def head_importance(model, data) -> list[torch.Tensor]:
    """Per layer (H_l,): mean over batches of |∂ loss / ∂ gate| (Michel et al. 2019)."""
    layers = attention_layers(model)
    for layer in layers:
        if not layer.gates_heads:
            raise ValueError(f"head importance: {type(layer.inner).__name__}'s heads cannot be told apart in its "
                             "output (no output projection by name, e.g. out_proj / W_O), so they cannot be gated")
    gates = [torch.ones(layer.n_heads, device=next(layer.parameters()).device, requires_grad=True)
             for layer in layers]
    total = [torch.zeros_like(g) for g in gates]
    try:
        for layer, gate in zip(layers, gates):
            layer.head_gate = gate
        for token_ids, mask, labels in data:
            loss = F.cross_entropy(model(token_ids, mask).logits, labels)
            grads = torch.autograd.grad(loss, gates)
            for t, g in zip(total, grads):
                t += g.abs()
    finally:
        for layer in layers:
            layer.head_gate = None
    return [(t / max(len(data), 1)).detach().cpu() for t in total]


@torch.no_grad()
def accuracy(model, data, removed: tuple[int, int] | None = None) -> float:
    """Accuracy over the batches; with removed=(layer, head) that head's gate is 0 (exact ablation)."""
    layers = attention_layers(model)
    if removed is not None:
        layer, head = removed
        gate = torch.ones(layers[layer].n_heads, device=next(layers[layer].parameters()).device)
        gate[head] = 0.0
        layers[layer].head_gate = gate
    try:
        right = total = 0
        for token_ids, mask, labels in data:
            right += int((model(token_ids, mask).logits.argmax(dim=-1) == labels).sum())
            total += len(labels)
    finally:
        if removed is not None:
            layers[removed[0]].head_gate = None
    return right / max(total, 1)


def least_important(importance: list[torch.Tensor], n: int) -> list[tuple[int, int]]:
    """The n (layer, head) pairs of lowest importance, never the last head of a layer; ValueError when n is more
    than the heads that can go (all but one per layer)."""
    counts = [len(t) for t in importance]
    removable = sum(counts) - len(counts)
    if not 0 <= n <= removable:
        raise ValueError(f"cannot prune {n} heads: the model has {sum(counts)} heads in {len(counts)} layers and "
                         f"every layer keeps one, so at most {removable} can go")
    ranked = sorted(((float(v), layer, head) for layer, t in enumerate(importance) for head, v in enumerate(t)))
    left, chosen = list(counts), []
    for _, layer, head in ranked:
        if len(chosen) == n:
            break
        if left[layer] > 1:
            chosen.append((layer, head))
            left[layer] -= 1
    return sorted(chosen)


def prune_checkpoint(checkpoint: dict, remove: list[tuple[int, int]]) -> dict:
    """A new checkpoint dict (plain data) without the given heads: W_Q, W_K, W_V rows and W_O columns cut, the
    network's layer_heads set. Training state (optimizer, loops, callbacks) is left out: it no longer fits."""
    network = dict(checkpoint["hyper_parameters"]["network"])
    if not attention_kind(network["attention"]).heads_cut:
        raise ValueError(f"heads of the attention {network['attention']} cannot be cut: the product does not know "
                         "how its weights are laid out per head")
    n_layers, n_heads = network["n_layers"], network["n_heads"]
    d_head = network.get("d_head") or network["d_model"] // n_heads
    counts = list(network.get("layer_heads") or [n_heads] * n_layers)
    for layer, head in remove:
        if not (0 <= layer < n_layers and 0 <= head < counts[layer]):
            raise ValueError(f"no head {head} in layer {layer} (layers 0..{n_layers - 1}, heads per layer {counts})")
    kept = [[h for h in range(counts[layer]) if (layer, h) not in set(remove)] for layer in range(n_layers)]
    if any(not heads for heads in kept):
        raise ValueError("every layer must keep at least one head")
    pattern = re.compile(r"(^|\.)blocks\.(\d+)\.attention\.(w_q|w_k|w_v|w_o)\.(weight|bias)$")
    state = {}
    for key, value in checkpoint["state_dict"].items():
        match = pattern.search(key)
        if match:
            layer, name, kind = int(match.group(2)), match.group(3), match.group(4)
            rows = torch.cat([torch.arange(h * d_head, (h + 1) * d_head) for h in kept[layer]])
            if name != "w_o":
                value = value[rows]  # (H·d, D) rows or (H·d,) bias
            elif kind == "weight":
                value = value[:, rows]  # (D, H·d) columns; W_O's bias is per output, unchanged
            value = value.clone()
        state[key] = value
    network["layer_heads"] = [len(heads) for heads in kept]
    pruned = [list(pair) for pair in sorted(remove)]
    earlier = checkpoint.get("pruned_heads") or []
    keep_keys = ("hyper_parameters", "TextDataModule", "datamodule_hyper_parameters", "hparams_name",
                 "datamodule_hparams_name", "pytorch-lightning_version", "epoch", "global_step")
    out = {key: checkpoint[key] for key in keep_keys if key in checkpoint}
    out["hyper_parameters"] = dict(checkpoint["hyper_parameters"]) | {"network": network}
    out["state_dict"] = state
    # Which heads went, in the head numbering of the checkpoint this one was cut from (plain lists).
    out["pruned_heads"] = earlier + [pruned]
    return out


def labelled(classifier, path, split: str, limit: int | None = None, seed: int | None = None,
             checkpoint: dict | None = None):
    """Batches of the checkpoint's `split` with labels in the classifier's label order: its first `limit` texts, or
    with seed a random sample of `limit`. ValueError when the split's labels are not the checkpoint's. `checkpoint`:
    the file's dict when the caller has read it already."""
    texts, labels, names = checkpoint_split(path, split, checkpoint)
    if sorted(names) != sorted(classifier.label_names):
        raise ValueError(f"{path}: the split's labels {names} differ from the checkpoint's {classifier.label_names}")
    index = {name: classifier.label_names.index(name) for name in names}
    rows = [(t, index[names[y]]) for t, y in zip(texts, labels) if has_text(t)]
    if limit is not None and seed is not None:
        rows = random.Random(seed).sample(rows, min(limit, len(rows)))
    rows = rows[:limit]
    return batches(classifier, [t for t, _ in rows], [y for _, y in rows])


def pruned_classifier(classifier, checkpoint: dict) -> TextClassifier:
    """The classifier a pruned checkpoint dict loads into, as predict.py would load it from its file."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "pruned.ckpt"
        torch.save(checkpoint, path)
        return TextClassifier.from_checkpoint(path, device=classifier.device)


def ablation(model, importance: list[torch.Tensor], data) -> tuple[float, list[dict], float | None]:
    """(accuracy, one row per head: its importance and the accuracy without it, Spearman of importance with the
    ablation drop over the heads)."""
    base = accuracy(model, data)
    heads = []
    for layer, values in enumerate(importance):
        for head, value in enumerate(values):
            ablated = accuracy(model, data, removed=(layer, head))
            heads.append({"layer": layer, "head": head, "importance": round(float(value), 6),
                          "ablation_accuracy": round(ablated, 4), "ablation_drop": round(base - ablated, 4)})
    agreement = spearman([h["importance"] for h in heads], [h["ablation_drop"] for h in heads])
    return base, heads, agreement


def pruning_table(classifier, checkpoint: dict, importance: list[torch.Tensor], data) -> list[dict]:
    """Accuracy with the N least important heads cut out, for every N that leaves each layer a head."""
    total = sum(len(t) for t in importance)
    table = []
    for n in range(total - len(importance) + 1):
        removed = least_important(importance, n)
        pruned = pruned_classifier(classifier, prune_checkpoint(checkpoint, removed))
        table.append({"heads_kept": total - n, "removed": [list(p) for p in removed],
                      "accuracy": round(accuracy(pruned.model, data), 4)})
    return table
