"""Checks that run the network again on a small validation sample, once per validation epoch (never every step):

    head_loss_delta    (n_layers, H) validation loss with the head's output zeroed (its head_gate 0) minus the loss
                       with every head: how much the loss needs the head. A uniform head the loss needs is an
                       averaging head doing its job; one it does not need is unused
    order_sensitivity  mean over texts of 3 or more tokens of max_c |p_c − p'_c|, p' the probabilities with the
                       text's real tokens after the first shuffled: exactly 0, up to float rounding, when positions
                       never reach the model. Defined for the kinds that say they are order-blind (`order_blind`,
                       model/kinds.py: full attention without the look-ahead mask; key windows and the causal mask
                       depend on order by themselves): NaN otherwise
    position_sensitivity  the same with the position vectors zeroed instead (every kind): exactly 0 when they never
                       reach the model
    unsteady_loss      |loss of a second identical evaluation pass − the first|: 0 for a deterministic network
    weight_similarity  (n_layers, H, H) mean cosine of two heads' W_Q, W_K and W_V slices: near 0 for independently
                       initialised heads, 1 for copies

Plain PyTorch: the network and a list of batches in, numbers out. The network is left as it was found (its
training flag, its head gates).
"""

import math

import torch
import torch.nn.functional as F

from model.kinds import attention_kind

SAMPLE_TEXTS = 256  # texts of the validation sample (the first batches of the validation set)


@torch.no_grad()
def model_checks(model, batches: list[dict]) -> dict:
    """The checks above for a classifier (`model(ids, padding_mask).logits`) on batches of input_ids, padding_mask
    and labels (on the model's device)."""
    was_training = model.training
    gates = [block.attention.head_gate for block in model.blocks]
    model.eval()
    try:
        base = mean_loss(model, batches)
        # NaN for the heads of a layer whose heads cannot be told apart in its output (gates_heads, model/kind.py)
        deltas = [[loss_without(model, block.attention, head, batches) - base if block.attention.gates_heads
                   else math.nan for head in range(block.attention.n_heads)] for block in model.blocks]
        checks = {"head_loss_delta": deltas, "unsteady_loss": abs(mean_loss(model, batches) - base),
                  "order_sensitivity": order_sensitivity(model, batches),
                  "position_sensitivity": position_sensitivity(model, batches),
                  "weight_similarity": [weight_similarity(block.attention) for block in model.blocks]}
    finally:
        for block, gate in zip(model.blocks, gates):
            block.attention.head_gate = gate
        model.train(was_training)
    return checks


def loss_without(model, attention, head: int, batches: list[dict]) -> float:
    """The mean loss with one head's output zeroed (its head_gate 0)."""
    gate = torch.ones(attention.n_heads, device=batches[0]["input_ids"].device)
    gate[head] = 0.0
    attention.head_gate = gate
    try:
        return mean_loss(model, batches)
    finally:
        attention.head_gate = None


def forward_passes(model) -> int:
    """Forward passes model_checks makes over its texts: the base loss, one per head zeroed, the second identical
    pass, and two each for the order check (kinds that say they are order-blind) and the position check."""
    config = model.config
    order = 2 if attention_kind(config.attention).order_blind(config) else 0
    position = 2 if getattr(model, "position_embedding", None) is not None else 0
    return 1 + sum(block.attention.n_heads for block in model.blocks) + 1 + order + position


def mean_loss(model, batches: list[dict]) -> float:
    total, count = 0.0, 0
    for batch in batches:
        logits = model(batch["input_ids"], batch["padding_mask"]).logits
        if batch["labels"].ndim == 2:  # several labels a text: binary cross-entropy per label, summed per text
            total += float(F.binary_cross_entropy_with_logits(logits.float(), batch["labels"].float(), reduction="sum"))
        else:
            total += float(F.cross_entropy(logits.float(), batch["labels"], reduction="sum"))
        count += len(batch["labels"])
    return total / max(count, 1)


def order_sensitivity(model, batches: list[dict]) -> float:
    config = model.config
    if not attention_kind(config.attention).order_blind(config):
        return math.nan
    generator = torch.Generator().manual_seed(0)
    total, count = 0.0, 0
    for batch in batches:
        ids, padding = batch["input_ids"], batch["padding_mask"]
        shuffled, moved = ids.clone(), []
        for row, length in enumerate((~padding).sum(dim=-1).tolist()):
            if length > 2:  # the first token stays: "first" pooling reads it
                order = torch.randperm(length - 1, generator=generator) + 1
                shuffled[row, 1:length] = ids[row, order.to(ids.device)]
                moved.append(row)
        if not moved:
            continue
        p = model(ids[moved], padding[moved]).logits.float().softmax(-1)
        q = model(shuffled[moved], padding[moved]).logits.float().softmax(-1)
        total += float((p - q).abs().amax(dim=-1).sum())
        count += len(moved)
    return total / count if count else math.nan  # no text long enough to shuffle: nothing to tell


def position_sensitivity(model, batches: list[dict]) -> float:
    """Mean max_c |p_c − p'_c| with the position embedding's output replaced by zeros (a forward hook)."""
    embedding = getattr(model, "position_embedding", None)
    if embedding is None:
        return math.nan
    p = [model(b["input_ids"], b["padding_mask"]).logits.float().softmax(-1) for b in batches]
    hook = embedding.register_forward_hook(lambda module, inputs, output: torch.zeros_like(output))
    try:
        q = [model(b["input_ids"], b["padding_mask"]).logits.float().softmax(-1) for b in batches]
    finally:
        hook.remove()
    return float(torch.cat([(a - b).abs().amax(dim=-1) for a, b in zip(p, q)]).mean())


def weight_similarity(attention) -> list[list[float]]:
    """(H, H) mean over W_Q, W_K, W_V of the cosine between two heads' slices (d × D each); NaN where the layer has
    none of them (a user's class without them by name, model/own_attention/layer.py)."""
    H = attention.n_heads
    slices = [F.normalize(linear.weight.detach().float().reshape(H, -1), dim=-1)
              for linear in (attention.w_q, attention.w_k, attention.w_v)
              if linear is not None and linear.weight.shape[0] % H == 0]
    if not slices:
        return [[math.nan] * H for _ in range(H)]
    return (sum(s @ s.T for s in slices) / len(slices)).tolist()


def sample_batches(batches, texts: int = SAMPLE_TEXTS) -> list[dict]:
    """The first batches of an iterable of batches, up to `texts` texts (whole batches)."""
    chosen, count = [], 0
    for batch in batches:
        chosen.append(batch)
        count += len(batch["labels"])
        if count >= texts:
            break
    return chosen
