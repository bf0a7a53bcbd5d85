"""The contract checks: what every working attention layer satisfies, whatever the bug (monitor/doctor.py turns
them into verdicts). Plain PyTorch, run once per validation on a small sample of validation texts (CONTRACT_TEXTS).

    formula      each layer recomputed from its own input x, the padding mask of the texts' lengths, the config's
                 look-ahead flag and scale, and its own W_Q, W_K, W_V, W_O, by an independent dense reference of its
                 kind's definition (monitor/reference.py, from the kind's `reference_keys_values`), and
                 compared stage by stage with what the layer computed and handed out: the scores (row-centred:
                 softmax ignores a constant added to a row), the mask (which keys a real query may see), the
                 weights, the heads' output before W_O, the output. The first stage that differs beyond rounding
                 (FORMULA_TOLERANCE) is named, by how much and how (monitor/stage_compare.py): a constant factor,
                 the other axis, another operand, a mask that differs
    invariances  the predictions (probabilities) must not move when the batch is padded further (padding),
                 when each text is run alone instead of with its batch neighbours (neighbours)
    blocks       each block recomputed around its attention layer (Block.reference, model/classifier.py): its
                 input (the embeddings of the texts' tokens and positions, or the block before's output), what its
                 attention layer received, the residual + LayerNorm after attention, and after the feed-forward,
                 each from the block's own recorded input, its attention's output and its own weights; the first
                 step that differs is named, and how (the residual left out, the LayerNorm on the residual only, ...)
    shared       no two parameters of the network are one tensor, share its memory, or hold exactly the same
                 matrix (the network declares no tied weights): a weight assigned twice (self.w_k = self.w_q)
    setting      the config's scale against 1/√d_k (formula_settings)
    optimizer    each parameter held by the optimizer with the configured learning rate and weight decay
                 (optimizer_differences; the module says what it configured)

Letters in the shape comments: B texts, L tokens, H heads, K keys of a row, D model width, N real tokens.
"""

import math
from contextlib import contextmanager

import torch

from data.tokenizer import pad
from model.attention import unpack
from model.classifier import feed_forward_reference, layer_norm_reference
from monitor.reference import reference
from monitor.stage_compare import compare_mask, compare_scores, compare_weights, differ, first_difference, operands
from monitor.views import token_window

CONTRACT_TEXTS = 16  # texts of the validation sample the contract checks read (a spread of lengths)
DENSE_ELEMENTS = 2**23  # at most B·H·L² entries per dense reference tensor: long texts are left out of the sample
STAGES = ("scores", "mask", "weights", "output before W_O", "output")


def contract_sample(batches: list[dict], texts: int = CONTRACT_TEXTS, heads: int = 1) -> list[torch.Tensor]:
    """Up to `texts` texts (their real token ids) of the batches, evenly spread over their lengths (so a padded
    batch of them has padding), none so long that a dense reference of them all would exceed DENSE_ELEMENTS."""
    found = [ids[~padding] for batch in batches for ids, padding in zip(batch["input_ids"], batch["padding_mask"])]
    found = sorted((ids for ids in found if len(ids) >= 1), key=len)
    limit = math.isqrt(DENSE_ELEMENTS // (texts * max(heads, 1)))
    found = [ids for ids in found if len(ids) <= limit] or found[:1]
    if len(found) <= texts:
        return found
    return [found[round(i * (len(found) - 1) / (texts - 1))] for i in range(texts)] if texts > 1 else found[:1]


def padded(texts: list[torch.Tensor], length: int | None = None):
    """(input_ids (B, L), padding_mask (B, L)) of texts, padded to `length` (default: the longest)."""
    ids, padding = pad([t.tolist() for t in texts])
    if length is not None and length > ids.shape[1]:
        extra = length - ids.shape[1]
        ids = torch.nn.functional.pad(ids, (0, extra))
        padding = torch.nn.functional.pad(padding, (0, extra), value=True)
    device = texts[0].device
    return ids.to(device), padding.to(device)


@torch.no_grad()
def contract_checks(model, batches: list[dict]) -> dict:
    """The formula, the blocks, the shared weights and the invariances on a sample of the batches (eval mode; the
    model is left as found). Returns {"formula": [per layer: {"stage", "difference", "how", "largest"}], "blocks":
    [per block: the same], "shared": [[name, name, why], ...], "invariance": {name: max |Δp|}}."""
    config = model.config
    texts = contract_sample(batches, heads=max(block.attention.n_heads for block in model.blocks))
    if not texts:
        return {}
    was_training = model.training
    model.eval()
    try:
        with torch.autocast(texts[0].device.type, enabled=False), full_float32():
            ids, padding = padded(texts)
            with captured(model) as records:
                logits = model(ids, padding, need_weights=True).logits
            formula = [compare(block.attention, record, padding, config)
                       for block, record in zip(model.blocks, records)]
            blocks = compare_blocks(model, records, ids, padding)
            return {"formula": formula, "blocks": blocks, "shared": shared_weights(model),
                    "invariance": invariances(model, texts, logits)}
    finally:
        model.train(was_training)


@contextmanager
def full_float32():
    """float32 matrix products at full float32 precision inside: train.py allows TensorFloat-32 ("high"), whose
    products on a GPU differ from float64 by about 1e-3 relative, as much as FORMULA_TOLERANCE; the checks judge the
    formula, not that rounding."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@contextmanager
def captured(model):
    """Records, per layer, what its forward_packed received and returned (x, its padding mask, the output, the
    weights it handed out), the input of its W_O (the heads' output), and per block what the block received and
    returned (block_in, block_out) and what its feed-forward received (between): one dict per layer. The block's
    are read by hooks on the call, so a block whose forward was replaced is recorded as it runs."""
    records, undo, hooks = [], [], []
    for block in model.blocks:
        layer, record = block.attention, {}

        def block_hook(module, args, kwargs, output, record=record):
            record.update(block_in=args[0] if args else kwargs["x"], block_out=output[0])

        hooks.append(block.register_forward_hook(block_hook, with_kwargs=True))
        if block.ffn is not None:
            hooks.append(block.ffn.register_forward_pre_hook(
                lambda module, args, record=record: record.update(between=args[0])))
        own = layer.__dict__.get("forward_packed")  # an instance attribute (a planted bug) is put back as it was

        def forward_packed(x, key_padding_mask, need_weights=False, original=layer.forward_packed, record=record):
            out, weights = original(x, key_padding_mask, need_weights)
            record.update(x=x, padding=key_padding_mask, out=out, attention=weights)
            return out, weights

        layer.forward_packed = forward_packed
        hook = None if layer.w_o is None else layer.w_o.register_forward_pre_hook(  # a user's class may have none
            lambda module, args, record=record: record.update(heads=args[0]))
        undo.append((layer, own, hook))
        records.append(record)
    try:
        yield records
    finally:
        for hook in hooks:
            hook.remove()
        for layer, own, hook in undo:
            if hook is not None:
                hook.remove()
            if own is None:
                del layer.forward_packed
            else:
                layer.forward_packed = own


def dense_handout(attention, L: int):
    """What a layer handed out, over the keys its reference uses: (weights, scores, allowed) each (B, H, L, K),
    scores -inf where the layer blocked a key. Each is read through monitor/views.py's token_window, which spreads a
    long kind's band onto the L tokens (and writes the sparse kind's global rows over rows 0..g-1); projected keys
    stay as they are."""
    weights = attention.weights.double()
    allowed = torch.ones_like(weights, dtype=torch.bool)
    if attention.blocked is not None:
        allowed = allowed & ~attention.blocked
    rows = attention.global_rows
    rows_allowed = None
    if rows is not None:
        rows_allowed = torch.ones_like(rows.weights, dtype=torch.bool)
        rows_allowed = rows_allowed if rows.blocked is None else rows_allowed & ~rows.blocked

    def dense(values, row_values=None):  # the hand-out with `values` in place of its weights, token × token
        global_rows = None if rows is None else rows._replace(weights=row_values)
        return token_window(attention._replace(weights=values, global_rows=global_rows), 0, L)

    seen = dense(allowed.double(), None if rows is None else rows_allowed.double()) > 0
    # A blocked place holds 0 here, so a token that fills two columns (a global key inside the band) sums to its score.
    scores = dense(attention.scores.double().masked_fill(~allowed, 0.0),
                   None if rows is None else rows.scores.double().masked_fill(~rows_allowed, 0.0))
    return dense(weights, None if rows is None else rows.weights.double()), scores.masked_fill(~seen, -math.inf), seen


def compare(layer, record: dict, padding: torch.Tensor, config) -> dict:
    """The layer's stages against its kind's reference on the same input; the first that differs, how much, how."""
    if layer.reference_keys_values is None:  # a kind with no definition (model/kind.py): a user's class
        return {"stage": None, "difference": math.nan, "how": "", "largest": math.nan,
                "skipped": f"{type(layer.inner).__name__}: {layer.convention}"}
    B, L = padding.shape
    received = record["padding"].bool() if record.get("padding") is not None else torch.zeros_like(padding)
    x = unpack(record["x"], ~received)  # (B, L, D) the layer's input, zeros where it was given padding
    scale = config.scale if config.scale is not None else 1.0 / math.sqrt(layer.d_head)
    ref = reference(layer, x, padding, scale=scale, causal=config.causal)
    rows = ~padding & ref.allowed.any(dim=-1)[:, 0]  # (B, L) real queries with a key to look at
    found = []  # (stage, difference, how)
    if record.get("attention") is not None:
        weights, scores, allowed = dense_handout(record["attention"], L)
        found += [compare_scores(scores, allowed, ref, rows), compare_mask(allowed, ref, rows, padding),
                  compare_weights(weights, ref, rows, padding)]
    if record.get("heads") is not None:
        heads = unpack(record["heads"], ~received).double()
        found.append(("output before W_O", *differ(heads[rows], ref.heads[rows], operands(ref, rows))))
    out = unpack(record["out"], ~received).double()
    found.append(("output", *differ(out[rows], ref.out[rows], {"W_O left out": ref.heads[rows]})))
    return first_difference(found)


def compare_blocks(model, records: list[dict], ids: torch.Tensor, padding: torch.Tensor) -> list[dict]:
    """Each block's steps against its definition (Block.reference) from what it received; the first that differs,
    how much, how. Block 0's input is compared with the embeddings recomputed from the token ids, each later block's
    with the output of the block before it."""
    results, before = [], None
    for i, (block, record) in enumerate(zip(model.blocks, records)):
        if "block_in" not in record or "out" not in record:
            results.append({"stage": None, "difference": math.nan, "how": "", "largest": math.nan})
            continue
        x, attended, out = (record[key].double() for key in ("block_in", "out", "block_out"))
        found = []  # (step, difference, how)
        if i == 0 and hasattr(model, "reference_embeddings"):
            embeddings = model.reference_embeddings(ids, padding)
            if x.shape != embeddings.shape:  # padding embedded like words, or real tokens left out
                results.append(first_difference([("input (the embeddings)", math.inf,
                                                   f"{len(x)} token vectors for the texts' {len(embeddings)} real "
                                                   "tokens")]))
                continue
            found.append(("input (the embeddings)", *differ(x, embeddings, {
                "the token vectors without their position vectors": model.reference_embeddings(ids, padding, False)})))
        elif before is not None and before.shape == x.shape:
            found.append(("input (the block before's output)", *differ(x, before)))
        found.append(("attention's input", *differ(record["x"].double(), x, {
            "LayerNorm(x): the norm before attention (pre-norm), while the block is post-norm":
                layer_norm_reference(block.norm1, x)})))
        between = record.get("between")
        ref = block.reference(x, attended, between)
        after = out if block.ffn is None or between is None else between.double()
        found.append(("residual + LayerNorm after attention", *differ(after, ref.after_attention,
                                                                      sublayer_forms(block.norm1, x, attended))))
        if block.ffn is not None and between is not None:
            h = between.double()
            found.append(("residual + LayerNorm after the feed-forward", *differ(out, ref.output, sublayer_forms(
                block.norm2, h, feed_forward_reference(block.ffn, h)))))
        results.append(first_difference(found))
        before = out
    return results


def sublayer_forms(norm, x: torch.Tensor, f: torch.Tensor) -> dict[str, torch.Tensor]:
    """What a sublayer LayerNorm(x + f(x)) becomes when written wrongly, by name: the ways to name a difference."""
    normed_x, normed_f = layer_norm_reference(norm, x), layer_norm_reference(norm, f)
    return {"the residual left out: LayerNorm(f(x)) without x": normed_f,
            "the LayerNorm on the residual only: LayerNorm(x) + f(x)": normed_x + f,
            "the LayerNorm left out: x + f(x)": x + f,
            "the LayerNorm on the sublayer only: x + LayerNorm(f(x))": x + normed_f,
            "the sublayer's output left out: LayerNorm(x)": normed_x}


def shared_weights(model) -> list[list[str]]:
    """[[name, name, how], ...]: pairs of the network's parameters that are one tensor, overlap in memory, or (two
    matrices that are not constant) hold exactly the same values. No network of this project ties weights, so any
    such pair is one weight serving two roles; a checkpoint stores a shared weight twice, so after loading it
    shows as equal values."""
    named = list(model.named_parameters(remove_duplicate=False))
    varied = {name: p.ndim >= 2 and bool((p != p.flatten()[0]).any()) for name, p in named}  # a matrix, not constant
    found = []
    for i, (name, p) in enumerate(named):
        for other, q in named[:i]:
            if p is q:
                how = "the same tensor"
            elif overlap(p, q):
                how = "the same memory"
            elif varied[name] and p.shape == q.shape and torch.equal(p, q):
                how = "exactly the same values"
            else:
                continue
            found.append([other, name, how])
    return found


def overlap(p: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether two tensors' elements lie in overlapping bytes of one storage."""
    if p.device != q.device or p.untyped_storage().data_ptr() != q.untyped_storage().data_ptr():
        return False
    start = lambda t: t.storage_offset() * t.element_size()  # noqa: E731
    end = lambda t: start(t) + max(t.numel(), 1) * t.element_size()  # noqa: E731
    return start(p) < end(q) and start(q) < end(p)


def optimizer_differences(network, optimizers, configured: dict[str, dict]) -> list[dict]:
    """Where the optimizers' parameter groups differ from what the run configured for each parameter of `network`
    (configured: {name: {"lr", "weight_decay"}}, ClassifierModule.configured_optimizer): one entry per setting and
    pair of values, {"setting", "value", "configured", "parameters": [names]}. A group's learning rate is its
    initial one (the schedule's start, "initial_lr"), when it has one. Parameters no group holds are the
    weight-not-learning check's."""
    groups = {id(p): group for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]}
    found = {}
    for name, p in network.named_parameters():
        group, wanted = groups.get(id(p)), configured.get(name)
        if group is None or wanted is None:
            continue
        held = {"lr": group.get("initial_lr", group.get("lr")), "weight_decay": group.get("weight_decay", 0.0)}
        for setting, value in wanted.items():
            given = held.get(setting)
            if given is not None and not math.isclose(float(given), float(value), rel_tol=1e-6, abs_tol=1e-12):
                found.setdefault((setting, float(given), float(value)), []).append(name)
    return [{"setting": setting, "value": value, "configured": wanted, "parameters": names}
            for (setting, value, wanted), names in found.items()]


def invariances(model, texts: list[torch.Tensor], logits: torch.Tensor) -> dict[str, float]:
    """max |Δp| over the sample when the batch is padded further (NaN when the texts already reach max_length)
    and when each text is run alone, against the batch as it was (logits)."""
    p = logits.float().softmax(-1)
    found = {"padding": math.nan}
    longest = max(len(t) for t in texts)
    target = min(model.max_length, longest + max(1, longest // 2))
    if target > longest:
        ids, padding = padded(texts, target)
        found["padding"] = float((model(ids, padding).logits.float().softmax(-1) - p).abs().max())
    alone = torch.cat([model(t[None], None).logits.float().softmax(-1) for t in texts])
    found["neighbours"] = float((alone - p).abs().max())
    return found


def formula_settings(config) -> dict[str, float]:
    """The config's scale as a multiple of 1/√d_k (1 when unset): {"scale_factor", "scale"}."""
    if config is None or getattr(config, "scale", None) is None:
        return {}
    d_head = config.d_head or config.d_model // config.n_heads
    return {"scale_factor": config.scale * math.sqrt(d_head), "scale": config.scale}
