"""Self-supervised pretraining of the classifier's embedding and attention blocks on unlabeled text.

Two objectives, on the same AttentionEncoder (model/classifier.py) the classifier is built on:

    masked     a random 15% of the real tokens are chosen; of those 80% become [UNK] (the mask: the same token
               that token_dropout puts in during fine-tuning), 10% a random token, 10% stay. The network predicts
               the original token at the chosen places only, through a head tied to the token embedding:
                   logits = LayerNorm(GELU(h W)) Eᵀ / √D + b      E the (V, D) embedding table, M chosen places
               so the softmax over the vocabulary is paid for M rows, not every token (BERT; Devlin et al. 2019).
    replaced   the chosen tokens are replaced by tokens drawn from the same batch (a sample of its unigram
               distribution), and the network says for every real token whether it was replaced: one logit per
               token, binary cross-entropy over all of them (ELECTRA's discriminator, without its generator).

The encoder's parameters keep the classifier's names (token_embedding, position_embedding, blocks), so fine-tuning
copies them as they are (training/encoder.py: encoder_state).

Letters in the shape comments: B batch, L tokens, N real tokens, M chosen tokens, D width, V vocabulary.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from model.classifier import AttentionEncoder
from model.config import NetworkConfig

OBJECTIVES = ("masked", "replaced")


class Corruption(NamedTuple):
    input_ids: torch.Tensor  # (B, L) the text the network reads
    chosen: torch.Tensor  # (B, L) bool: the places the objective is about (masked: predicted; replaced: swapped)
    targets: torch.Tensor  # masked: (M,) original ids at the chosen places; replaced: (N,) 1.0 where replaced


def choose(input_ids: torch.Tensor, key_padding_mask: torch.Tensor, fraction: float,
           generator: torch.Generator | None = None, *, first_word_id: int) -> torch.Tensor:
    """(B, L) bool: each real word (not padding, no special token: ids from `first_word_id` on) chosen with
    probability `fraction`; a text with any word gets at least one (one drawn among them), so no text is read for
    nothing."""
    candidates = ~key_padding_mask & (input_ids >= first_word_id)  # (B, L)
    noise = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)  # (B, L)
    chosen = candidates & (noise < fraction)
    # The candidate with the smallest noise of each row, for rows where nothing was chosen.
    first = noise.masked_fill(~candidates, 2.0).argmin(dim=1)  # (B,)
    fallback = torch.zeros_like(chosen).scatter_(1, first[:, None], True) & candidates
    return chosen | (fallback & ~chosen.any(dim=1, keepdim=True))


def corrupt(objective: str, input_ids: torch.Tensor, key_padding_mask: torch.Tensor, fraction: float,
            vocab_size: int, generator: torch.Generator | None = None, *, mask_id: int,
            first_word_id: int) -> Corruption:
    """The objective's input and targets for a batch (see the module docstring). The tokenizer's ids: `mask_id`
    hides a token, ids below `first_word_id` are special tokens, never chosen nor drawn."""
    chosen = choose(input_ids, key_padding_mask, fraction, generator, first_word_id=first_word_id)
    device = input_ids.device
    if objective == "masked":
        roll = torch.rand(input_ids.shape, generator=generator, device=device)  # (B, L)
        random_ids = torch.randint(first_word_id, max(vocab_size, first_word_id + 1), input_ids.shape,
                                   generator=generator, device=device)
        corrupted = torch.where(chosen & (roll < 0.8), mask_id, input_ids)
        corrupted = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), random_ids, corrupted)
        return Corruption(corrupted, chosen, input_ids[chosen])
    if objective == "replaced":
        real = ~key_padding_mask
        pool = input_ids[real]  # (N,) every real token of the batch: a draw from it is a unigram sample
        draw = torch.randint(0, len(pool), (int(chosen.sum()),), generator=generator, device=device)
        corrupted = input_ids.clone()
        corrupted[chosen] = pool[draw]
        replaced = corrupted != input_ids  # a draw of the same token is no replacement
        return Corruption(corrupted, replaced, replaced[real].float())
    raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")


class PretrainingOutput(NamedTuple):
    logits: torch.Tensor  # masked: (M, V) at the asked places; replaced: (N,) one logit per real token
    attention: tuple | None  # one per layer, when asked for


class PretrainingNetwork(AttentionEncoder):
    """The classifier's encoder with the objective's head in place of pooling and the class head."""

    def __init__(self, config: NetworkConfig, objective: str = "masked"):
        super().__init__(config)
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
        self.objective = objective
        if objective == "masked":
            self.transform = nn.Sequential(nn.Linear(config.d_model, config.d_model), nn.GELU(),
                                           nn.LayerNorm(config.d_model))
            self.token_bias = nn.Parameter(torch.zeros(config.vocab_size))  # the head's weight is token_embedding's
        else:
            self.replaced_head = nn.Linear(config.d_model, 1)

    def forward(self, token_ids: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                need_weights: bool = False, predict_at: torch.Tensor | None = None) -> PretrainingOutput:
        """token_ids, key_padding_mask (B, L) as for the classifier; predict_at (B, L) bool: masked only, the places
        to predict (default every real token)."""
        if key_padding_mask is None:
            key_padding_mask = torch.zeros(token_ids.shape, dtype=torch.bool, device=token_ids.device)
        x, real, attention = self.encode(token_ids, key_padding_mask, need_weights)  # x (N, D)
        attention = tuple(attention) if need_weights else None
        if self.objective == "replaced":
            return PretrainingOutput(self.replaced_head(x).squeeze(-1), attention)  # (N,)
        if predict_at is not None:
            x = x[predict_at[real]]  # (M, D): the chosen places among the real tokens, in the same order
        # Tied to E, and scaled by 1/√D (as T5 does for its tied head): E's rows have norm ≈ √D at initialisation,
        # so unscaled logits would start with a spread of ≈ √D and a loss far above log V.
        logits = self.transform(x) @ self.token_embedding.weight.T * self.config.d_model**-0.5  # (M, V)
        logits = logits + self.token_bias
        return PretrainingOutput(logits, attention)

    def loss(self, corruption: Corruption, key_padding_mask: torch.Tensor,
             need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor, PretrainingOutput]:
        """(loss, the objective's accuracy, output): masked tokens predicted right, or tokens classified right
        as replaced or original."""
        if self.objective == "masked":
            output = self(corruption.input_ids, key_padding_mask, need_weights, predict_at=corruption.chosen)
            loss = F.cross_entropy(output.logits, corruption.targets)
            correct = (output.logits.argmax(-1) == corruption.targets).float()
        else:
            output = self(corruption.input_ids, key_padding_mask, need_weights)
            loss = F.binary_cross_entropy_with_logits(output.logits, corruption.targets)
            correct = ((output.logits > 0).float() == corruption.targets).float()
        return loss, correct, output
