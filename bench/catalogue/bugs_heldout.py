"""Held-out attention bugs: mistakes people make when they write or train attention by hand, each taken from a
public report or a textbook, written without reading the doctor's checks or the catalogue of bench/catalogue/bugs.py.

    python -m bench.diagnosis --bugs bench.catalogue.bugs_heldout:scaled_twice     # one of them, by module:function

They plant themselves through bench.catalogue.bugs' Plant only (network settings, replacements of attention(),
edits of the built module and its layers), so nothing in the product code knows about them. `expects` is None for all
of them: any warning is right, silence is wrong. Each docstring's first paragraph says what the bug does, its
`Source:` line where such a mistake is reported. In five parts, in this order: the formula, the masks, the network
around attention, the optimizer and training loop, and runs that stay at chance (the labels, the schedule, the model
validated, the loss).

A few need more than one head to mean anything (a head order cannot be wrong with one head); their docstrings say so.
"""

import copy
import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from bench.catalogue.bugs import (Plant, bug, masked_kinds, networks, replace_attention, replace_mask,
                                   scale_head_and_rest)
from model.attention import AttentionWeights, attention_mask

ROBERTA_PAD_ID = 1  # the padding id of RoBERTa-style tokenizers; this project's [PAD] is 0 and 1 is [UNK]


def written(q, k, v, blocked=None, *, scale: float, dropout=None, need_weights: bool = False,
            scores=None, fill=None, softmax_dim: int = -1):
    """attention() as someone writes it by hand, with the step a bug gets wrong swapped in: `scores(q, k, scale)`
    makes the (…, L, K) scores, `fill(scores, blocked)` masks them, `softmax_dim` is the axis normalised. Same
    arguments and outputs as model.attention.attention()."""
    s = (q @ k.transpose(-2, -1)) * scale if scores is None else scores(q, k, scale)  # (…, L, K)
    if blocked is not None:
        s = s.masked_fill(blocked, torch.finfo(s.dtype).min / 2) if fill is None else fill(s, blocked)
    weights = s.softmax(dim=softmax_dim)
    out = (weights if dropout is None else dropout(weights)) @ v  # (…, L, d)
    if blocked is not None:
        empty = blocked.all(dim=-1, keepdim=True)  # a query with no key to look at gives 0, as in attention()
        out = out.masked_fill(empty, 0.0)
        if need_weights:
            weights = weights.masked_fill(empty, 0.0)
    return out, AttentionWeights(weights, s, blocked) if need_weights else None


def wrap_attend(plant: Plant, change) -> None:
    """Every layer's attend(q, k, v, blocked, need_weights) becomes change(original attend, q, k, v, blocked,
    need_weights): q, k, v (B, H, L, d) as the projections hand them over, for every kind."""

    def edit(layer):
        original = layer.attend
        layer.attend = lambda q, k, v, blocked, need_weights=False: change(original, q, k, v, blocked, need_weights)

    plant.layers(edit)


def blocks(module) -> list:
    """Every Block of every network the module trains or evaluates."""
    return [block for network in networks(module) for block in network.blocks]


def rewire_attention_sublayer(plant, sublayer):
    """Every block's forward with its attention sublayer written as `sublayer(block, x, attended)` (the healthy one
    is block.norm1(x + block.dropout(attended))); the feed-forward sublayer after it stays as it is."""

    def edit(module):
        for block in blocks(module):
            def forward(x, key_padding_mask, need_weights=False, block=block):
                attended, weights = block.attention.forward_packed(x, key_padding_mask, need_weights)
                x = sublayer(block, x, attended)
                if block.ffn is not None:
                    x = block.norm2(x + block.dropout(block.ffn(x)))
                return x, weights

            block.forward = forward

    plant.module(edit)


# ---- the formula ------------------------------------------------------------------------------------------------


@bug(group="heldout")
def scale_by_model_width(plant):
    """Scores divided by √(H·d), the width of all heads together (d_model), instead of one head's √d_k.

    No effect with a single head. Source: https://github.com/karpathy/ng-video-lecture/pull/6 ("We should scale
    attention by head size"), https://github.com/omihub777/ViT-CIFAR/pull/11
    """
    replace_attention(plant, lambda attend: lambda q, k, v, blocked=None, *, scale, **options: attend(
        q, k, v, blocked, scale=1.0 / math.sqrt(q.shape[1] * q.shape[-1]), **options))  # q (B, H, …, d)


@bug(group="heldout")
def scaled_twice(plant):
    """The queries are scaled by 1/√d_k before the product and the scores again after it: scores are q·k / d_k.

    Source: https://github.com/getalp/Flaubert/pull/45 (a division of the scores by √d proposed on code that already
    divides q by √d), https://github.com/facebookresearch/XLM/pull/357
    """
    replace_attention(plant, lambda attend: lambda q, k, v, blocked=None, *, scale, **options: attend(
        q * scale, k, v, blocked, scale=scale, **options))


@bug(group="heldout")
def softmax_over_heads(plant):
    """softmax(scores, dim=1), written for (L, K) scores, applied to the batched (B, H, L, K) ones: each score is
    normalised across the heads instead of across the keys.

    Source: https://github.com/datawhalechina/llms-from-scratch-cn/issues/54 (dim=1 breaks on batched scores),
    https://github.com/PetrochukM/PyTorch-NLP/issues/2
    """
    replace_attention(plant, lambda attend: partial(written, softmax_dim=1))


@bug(group="heldout")
def keys_viewed_not_transposed(plant):
    """Kᵀ written as k.view(…, d, K) instead of k.transpose(-2, -1): the shapes fit, the numbers are scrambled.

    Source: https://github.com/rish-16/tokenlearner-pytorch/issues/1 (view used where transpose was meant),
    https://github.com/hyunwoongko/transformer/issues/15
    """
    replace_attention(plant, lambda attend: partial(
        written, scores=lambda q, k, scale: (q @ k.reshape(*k.shape[:-2], k.shape[-1], k.shape[-2])) * scale))


@bug(group="heldout")
def heads_split_without_transpose(plant):
    """Heads split with x.view(B, H, L, d) instead of x.view(B, L, H, d).transpose(1, 2), and merged back the same
    way: each head's "tokens" are slices of several tokens' features.

    No effect with a single head. Source: https://github.com/reczoo/FuxiCTR/issues/30,
    https://github.com/649453932/Chinese-Text-Classification-Pytorch/issues/53
    """

    def split_wrongly(t):  # t (B, H, L, d) split right → what view(B, H, L, d) of the (B, L, H·d) projection gives
        B, H, L, d = t.shape
        return t.transpose(1, 2).reshape(B, H, L, d)

    def change(attend, q, k, v, blocked, need_weights):
        out, weights = attend(split_wrongly(q), split_wrongly(k), split_wrongly(v), blocked, need_weights)
        B, H, L, d = out.shape
        # merged with view(B, L, H·d): handed back in the (B, H, L, d) layout the caller merges correctly
        return out.reshape(B, L, H, d).transpose(1, 2), weights

    wrap_attend(plant, change)


@bug(group="heldout")
def heads_merged_without_transpose(plant):
    """The heads' outputs (B, H, L, d) merged with reshape(B, L, H·d) without the transpose(1, 2) first: each
    token's vector is made of pieces of other tokens.

    No effect with a single head. Source: https://github.com/jsbaan/transformer-from-scratch/pull/6,
    https://github.com/649453932/Chinese-Text-Classification-Pytorch/issues/10
    """

    def change(attend, q, k, v, blocked, need_weights):
        out, weights = attend(q, k, v, blocked, need_weights)
        B, H, L, d = out.shape
        return out.reshape(B, L, H, d).transpose(1, 2), weights  # the caller's merge then gives out.reshape(B, L, H·d)

    wrap_attend(plant, change)


@bug(group="heldout")
def values_from_another_head(plant):
    """Each head weighs the values of the next head (v's heads in another order than q's and k's).

    No effect with a single head. Source: https://github.com/lsdefine/attention-is-all-you-need-keras/issues/36
    (one tensor folded head-major, the one it is combined with batch-major)
    """
    wrap_attend(plant, lambda attend, q, k, v, blocked, need_weights: attend(
        q, k, v.roll(1, dims=1), blocked, need_weights))


@bug(group="heldout")
def keys_from_query_projection(plant):
    """A copy-paste slip: the keys are made with W_Q (k = self.w_q(x)), so every score is q_i·q_j and W_K is gone.

    Source: https://github.com/stevezheng23/sequence_labeling_tf/pull/81 ("fix query/key/value project matrix reuse
    issue")
    """
    plant.layers(lambda layer: setattr(layer, "w_k", layer.w_q))


# ---- the masks --------------------------------------------------------------------------------------------------


@bug(group="heldout", kinds=masked_kinds)
def padding_mask_off_by_one(plant):
    """The padding mask built from the lengths one place late (np.arange(length + 1, L) for the padded places):
    each padded text's first padding token is treated as a real key.

    Source: https://github.com/ajhalthor/Transformer-Neural-Network/issues/15 ("Padding mask indices error")
    """
    replace_mask(plant, lambda padding: padding & F.pad(padding, (1, 0))[:, :-1])  # padded and after a padded place


@bug(group="heldout", kinds=masked_kinds)
def mask_fill_near_zero(plant):
    """Blocked scores filled with -1e-9 (meant: -1e9), about 0: padded and out-of-window keys keep the weight a
    zero score gets.

    Source: https://github.com/Shujun-He/RibonanzaNet/issues/5, https://github.com/hyunwoongko/transformer/issues/10
    """
    replace_attention(plant, lambda attend: partial(written, fill=lambda s, blocked: s.masked_fill(blocked, -1e-9)))


@bug(group="heldout", kinds=("full",))
def padding_mask_on_query_axis(plant):
    """The padding mask unsqueezed as (B, 1, L, 1) instead of (B, 1, 1, L): it blocks the padded queries' rows, and
    every real query looks at the padded keys.

    Source: https://github.com/hyunwoongko/transformer/pull/40 (".unsqueeze(1).unsqueeze(3) will got wrong broadcast
    result"), https://github.com/lucidrains/x-transformers/issues/172
    """

    def edit(layer):
        def mask(key_padding_mask, L, device=None):
            blocked = attention_mask(None, layer.look_ahead, L, device)  # the look-ahead part, if any, is right
            if key_padding_mask is not None:
                rows = key_padding_mask.bool()[:, None, :, None]  # (B, 1, L, 1): padded queries
                blocked = rows if blocked is None else blocked | rows
            return blocked

        layer.mask = mask

    plant.layers(edit)


@bug(group="heldout", kinds=masked_kinds)
def padding_from_token_id(plant):
    """The attention mask built from the token ids, `input_ids == 1` (RoBERTa's padding id), for a tokenizer whose
    padding id is 0: the real padding is visible and every [UNK] token (id 1 here) is hidden.

    Source: https://github.com/allenai/allennlp/issues/3359, https://github.com/coastalcph/trldc/issues/1
    """

    def edit(module):
        for network in networks(module):
            seen = {}
            encode = network.encode

            def encode_noting_ids(token_ids, key_padding_mask=None, need_weights=False, encode=encode, seen=seen):
                seen["ids"] = token_ids
                return encode(token_ids, key_padding_mask, need_weights)

            network.encode = encode_noting_ids
            for block in network.blocks:
                original = block.attention.mask

                def mask(key_padding_mask, L, device=None, original=original, seen=seen):
                    ids = seen.get("ids")
                    if key_padding_mask is not None and ids is not None and ids.shape == key_padding_mask.shape:
                        key_padding_mask = ids == ROBERTA_PAD_ID
                    return original(key_padding_mask, L, device)

                block.attention.mask = mask

    plant.module(edit)


@bug(group="heldout", kinds=("full",))
def causal_mask_hides_diagonal(plant):
    """The look-ahead mask built with triu(diagonal=0) instead of diagonal=1: each token sees only the tokens
    before it, never itself, and the first token sees nothing.

    Source: https://github.com/RVC-Boss/GPT-SoVITS/issues/965 (the diagonal of the causal mask off by one),
    https://github.com/TransformerLensOrg/TransformerLens/issues/284
    """
    plant.network(causal=True)

    def edit(layer):
        mask = layer.mask  # full attention's (B or 1, 1, L, L) mask: the diagonal is the query's own key
        layer.mask = lambda key_padding_mask, L, device=None: mask(key_padding_mask, L, device) | torch.eye(
            L, dtype=torch.bool, device=device)

    plant.layers(edit)


# ---- the network around attention -------------------------------------------------------------------------------


@bug(group="heldout")
def residual_dropped(plant):
    """The attention sublayer without its residual: x = LayerNorm(dropout(attention(x))) instead of
    LayerNorm(x + dropout(attention(x))); the token's own vector reaches the next step only through attention.

    Source: https://github.com/xmu-xiaoma666/External-Attention-pytorch/issues/35 ("there aren't residual
    connection and norm layers")
    """

    rewire_attention_sublayer(plant, lambda block, x, attended: block.norm1(block.dropout(attended)))


@bug(group="heldout")
def norm_on_residual_only(plant):
    """LayerNorm put on the wrong tensor: x = LayerNorm(x) + dropout(attention(x)) instead of
    LayerNorm(x + dropout(attention(x))); the attention output enters the stream unnormalised.

    Source: https://github.com/Project-MONAI/MONAI/pull/9011 (review: the residual stream overwritten by the
    normed value), https://github.com/hkproj/pytorch-transformer/issues/14
    """

    rewire_attention_sublayer(plant, lambda block, x, attended: block.norm1(x) + block.dropout(attended))


@bug(group="heldout")
def output_projection_skipped(plant):
    """W_O defined but never applied: the concatenated heads go straight into the residual (W_O stays a parameter
    that no output depends on).

    Needs n_heads · d_head = d_model (the default head size). Source:
    https://github.com/stevezheng23/sequence_labeling_tf/pull/83 ("fix issue of missing projection layer in
    multi-head attention"), https://github.com/Kyubyong/transformer/pull/17
    """
    plant.layers(lambda layer: setattr(layer.w_o, "forward", lambda t: t))


@bug(group="heldout")
def positions_after_attention(plant):
    """The position embedding added to the output of the first attention block instead of to its input: that
    block sees a bag of tokens.

    Source: d2l.ai §11.6 "Self-Attention and Positional Encoding" (self-attention alone ignores order; positions are
    added to the input representation), https://github.com/Kyubyong/transformer/issues/3
    """

    def edit(module):
        for network in networks(module):
            table = network.position_embedding
            table.forward = lambda positions, table=table: positions.new_zeros(
                *positions.shape, table.embedding_dim, dtype=table.weight.dtype)
            first = network.blocks[0]
            forward = first.forward

            def forward_then_positions(x, key_padding_mask, need_weights=False, forward=forward, table=table):
                x, weights = forward(x, key_padding_mask, need_weights)
                positions = (~key_padding_mask.bool()).nonzero(as_tuple=True)[1]  # (N,) as encode() numbers them
                return x + F.embedding(positions, table.weight), weights

            first.forward = forward_then_positions

    plant.module(edit)


class AlwaysDropout(nn.Module):
    """Dropout through F.dropout(x, p) without training=self.training: F.dropout's default is training=True."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p)


@bug(group="heldout")
def attention_dropout_in_eval(plant):
    """Attention dropout 0.1 written as F.dropout(weights, p) without training=self.training: it stays on in
    validation and prediction, so two passes over the same text disagree.

    Source: https://github.com/rixwew/pytorch-fm/issues/21, https://github.com/pytorch/pytorch/issues/124464
    """
    plant.network(attention_dropout=0.1)
    plant.layers(lambda layer: setattr(layer, "dropout", AlwaysDropout(layer.dropout.p)))


# ---- the optimizer and the training loop ------------------------------------------------------------------------


@bug(group="heldout")
def key_projection_detached(plant):
    """k.detach() left in the layer (from a debugging session): the forward pass is unchanged, no gradient reaches
    W_K (nor x through the keys), and only weight decay moves W_K.

    Source: https://github.com/bboylyg/NAD/issues/8 (a .detach() before backward silently cut a loss term),
    https://prodopsy.com/how-can-the-backward-function-in-tensor-influence-the-matrix-in-model
    """
    wrap_attend(plant, lambda attend, q, k, v, blocked, need_weights: attend(q, k.detach(), v, blocked, need_weights))


@bug(group="heldout")
def heads_in_python_list(plant):
    """W_Q, W_K and W_V kept in a plain Python list instead of an nn.ModuleList: model.parameters() (so the
    optimizer and the checkpoint) never see them; they stay at their random start.

    Moving the model to another device would leave them behind. Source: https://github.com/pytorch/pytorch/issues/715,
    https://github.com/pytorch/pytorch/issues/38639
    """

    def edit(layer):
        names = ("w_q", "w_k", "w_v")
        layer.projections = [layer._modules.pop(name) for name in names]  # a list: nn.Module registers nothing in it
        for name, projection in zip(names, layer.projections):
            object.__setattr__(layer, name, projection)  # still reachable as layer.w_q, as the list's users write

    plant.layers(edit)


@bug(group="heldout")
def query_requires_grad_off(plant):
    """W_Q left with requires_grad=False (frozen for a fine-tuning experiment, never unfrozen): it keeps its random
    start while everything else trains.

    Source: https://github.com/wannabeOG/MAS-PyTorch/issues/1 (requires_grad set on the wrong layers),
    https://github.com/ultralytics/yolov5/issues/1213
    """
    plant.layers(lambda layer: layer.w_q.requires_grad_(False))


@bug(group="heldout")
def weight_decay_one(plant):
    """AdamW's weight decay set to 1.0 (an L2 coefficient read as a decoupled decay): every matrix shrinks by
    lr · 1.0 of itself at each step.

    Source: https://github.com/fastai/fastai/issues/1806, https://github.com/mlfoundations/open_clip/issues/32
    (weight decay confused with weight decay × learning rate)
    """
    plant.module(lambda module: setattr(module.hparams, "weight_decay", 1.0))


@bug(group="heldout")
def layer_decay_zero(plant):
    """Layer-wise learning-rate decay with decay 0 (meant as "off"): lr · 0^depth is 0 for every parameter but the
    classifier head's, so embeddings and attention never move.

    Source: https://github.com/facebookresearch/mae/blob/main/util/lr_decay.py (layer_scales = layer_decay **
    (num_layers - i)), https://github.com/huggingface/pytorch-image-models/pull/2532
    """

    plant.module(partial(scale_head_and_rest, head=1.0, rest=0.0))  # lr · 0 for all but the head


@bug(group="heldout")
def zero_grad_after_backward(plant):
    """optimizer.zero_grad() called between loss.backward() and optimizer.step(): every step finds no gradient,
    and no weight ever moves.

    Source: https://discuss.pytorch.org/t/what-does-the-backward-function-do/9944/2 (zero_grad belongs before
    backward), and a post on where it may go ("anywhere but between backward and step"):
    https://velog.io/@rhss10/기본-optimizer.zerograd는-어디에-넣어주어야-할까
    """
    plant.module(lambda module: setattr(module, "on_after_backward", lambda: module.optimizers().zero_grad()))


# ---- runs stuck at chance: the labels, the schedule, the model validated, the loss --------------------------------


def edit_batches(plant: Plant, change, training: bool) -> None:
    """Every batch of training (training=True) or of validation becomes change(module, batch) once on its device,
    before the step and the callbacks read it (the module's on_after_batch_transfer hook)."""

    def edit(module):
        def on_after_batch_transfer(batch, dataloader_idx=0):
            trainer = module.trainer
            return change(module, batch) if (trainer.training if training else trainer.validating) else batch

        module.on_after_batch_transfer = on_after_batch_transfer

    plant.module(edit)


@bug(group="heldout")
def training_labels_out_of_step(plant):
    """The training labels one text behind their texts: texts and labels read from two lists, one of them shifted by
    one (a header row dropped from one file only, or the two shuffled apart), so a text's label is its neighbour's.

    Source: https://github.com/udacity/sdc-issue-reports/issues/1326 (features and labels shuffled in different
    orders), https://github.com/dennybritz/cnn-text-classification-tf/issues/136
    """
    edit_batches(plant, lambda module, batch: batch | {"labels": batch["labels"].roll(1, 0)}, training=True)


@bug(group="heldout")
def validation_labels_other_mapping(plant):
    """The validation split's labels numbered by another mapping than the training split's (the classes in the
    reverse order: one split numbered by first appearance, the other alphabetically), so the model is scored on
    classes it was not taught.

    Source: https://github.com/uzh-rpg/rpg_event_representation_learning/issues/2 (train and test label mappings
    inconsistent), https://github.com/open-mmlab/mmdetection/issues/2361 (category ids differing between the train
    and the validation file)
    """

    def renumbered(module, batch):
        labels = batch["labels"]
        if labels.ndim == 2:  # several labels a text: the label columns in the reverse order
            return batch | {"labels": labels.flip(-1)}
        return batch | {"labels": len(module.label_names) - 1 - labels}

    edit_batches(plant, renumbered, training=False)


@bug(group="heldout")
def cosine_schedule_in_epochs(plant):
    """The warm-up and cosine schedule sized in epochs (trainer.max_epochs) but stepped after every batch
    ("interval": "step"): the learning rate reaches 0 after max_epochs optimizer steps and stays there.

    Source: https://github.com/sthalles/SimCLR/issues/8 (CosineAnnealingLR's T_max and where scheduler.step() is
    called), https://github.com/skorch-dev/skorch/issues/610, https://github.com/pytorch/pytorch/issues/11210
    """

    def edit(module):
        configure = module.configure_optimizers

        def configure_optimizers():
            result = configure()
            optimizer = result["optimizer"]
            total = max(1, module.trainer.max_epochs)  # epochs, where the schedule counts optimizer steps
            warmup = max(1, int(module.hparams.warmup_fraction * total))

            def schedule(step):
                if step < warmup:
                    return (step + 1) / warmup
                return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

        module.configure_optimizers = configure_optimizers

    plant.module(edit)


@bug(group="heldout")
def weight_average_never_updated(plant):
    """A weight average (EMA) of the trained network kept for validation and prediction, whose update after each
    optimizer step is never called: the model validated and saved stays at its random start while the one trained
    learns.

    Source: https://github.com/pengzhiliang/MAE-pytorch/issues/31 (the EMA weights and the model evaluated not the
    same), https://github.com/lucidrains/DALLE2-pytorch/issues/131 (an EMA model that "refuses to learn")
    """

    def edit(module):
        if module._online is None:  # the run as configured keeps no average: add one, as ema_decay would
            module.hparams["ema_decay"] = 0.999
            module._online = copy.deepcopy(module.model)
        module.average = None  # the module then never updates `model` from the network trained

    plant.module(edit)


@bug(group="heldout")
def loss_on_probabilities(plant):
    """The loss written as F.cross_entropy(logits.softmax(-1), y): cross_entropy applies its own log-softmax, so it
    is fed probabilities. Its gradient is small, and it can never fall below log(1 + (C - 1)/e) (0.31 for two
    classes).

    Source: https://github.com/ariecattan/SciCo/issues/2 ("Double-softmax in validation loss"),
    https://github.com/gitabcworld/MatchingNetworks/issues/5, https://github.com/tflearn/tflearn/pull/562
    """

    def edit(module):
        loss = module.loss

        def on_probabilities(logits, targets, **settings):
            if module.hparams.multi_label:
                return loss(logits.sigmoid(), targets, **settings)
            return F.cross_entropy(logits.softmax(-1), targets, reduction="none", **settings)

        module.loss = on_probabilities

    plant.module(edit)
