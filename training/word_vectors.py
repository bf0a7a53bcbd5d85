"""Skip-gram word vectors of the training texts, as the classifier's starting token embedding.

The cheapest self-pretraining there is (word2vec's skip-gram with negative sampling; Mikolov et al. 2013): each
word's vector u and a second "context" table c are trained so that a word and its neighbours within a few
tokens score high and random words low,

    loss = −log σ(u_w · c_n) − Σ_k log σ(−u_w · c_k)      n a neighbour of w, k drawn ∝ count^0.75

Words that appear in the same company get similar vectors before a single label is read, so a word the labels
see a few times starts next to the words it behaves like. Only u is kept: it becomes token_embedding.weight.

Written for the flat id stream the data module already holds (data/encoded.py EncodedSplit: ids, offsets):
frequent words are thinned out each epoch (word2vec's subsampling), windows never cross from one text to the
next, and the stream is cut into chunks of `chunk` tokens, one Adam step each.
"""

import logging
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from data.tokenizer import FIRST_WORD_ID

log = logging.getLogger(__name__)

NOISE_WORDS = 64  # negative words drawn per step, shared by all its pairs


def keep_probability(counts: torch.Tensor, threshold: float) -> torch.Tensor:
    """(V,) chance that one occurrence of each word stays in an epoch's stream: word2vec's subsampling,
    (√(f/t) + 1)·t/f for a word of frequency f, at most 1, so a word under the threshold t always stays."""
    frequency = counts.double() / max(1, int(counts.sum()))
    ratio = threshold / frequency.clamp_min(1e-12)
    return (ratio.sqrt() + ratio).clamp(max=1.0).float()


def window_pairs(ids: torch.Tensor, text: torch.Tensor, window: int,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(center, context) word ids of every pair in a chunk of the stream: ids, text (T,) the word and the text it
    belongs to. Each center draws its window size from 1..window (word2vec's dynamic window: near neighbours
    count more); pairs never join two texts."""
    reach = torch.randint(1, window + 1, ids.shape, generator=generator)  # (T,)
    centers, contexts = [], []
    for k in range(1, min(window, len(ids) - 1) + 1):
        same = text[:-k] == text[k:]  # (T - k,): positions i and i + k in one text
        ahead = same & (k <= reach[:-k])  # i sees i + k
        behind = same & (k <= reach[k:])  # i + k sees i
        centers += [ids[:-k][ahead], ids[k:][behind]]
        contexts += [ids[k:][ahead], ids[:-k][behind]]
    if not centers:
        return ids[:0], ids[:0]
    return torch.cat(centers), torch.cat(contexts)


class SkipGram(nn.Module):
    def __init__(self, vocab_size: int, dim: int, generator: torch.Generator | None = None):
        super().__init__()
        # word2vec's start: small random word vectors, zero context vectors.
        self.words = nn.Parameter(torch.empty(vocab_size, dim).uniform_(-0.5 / dim, 0.5 / dim, generator=generator))
        self.contexts = nn.Parameter(torch.zeros(vocab_size, dim))

    def forward(self, centers: torch.Tensor, contexts: torch.Tensor, noise: torch.Tensor,
                negatives: int) -> torch.Tensor:
        """Mean loss of P pairs: centers, contexts (P,) word ids; noise (S,) words drawn from the noise
        distribution, shared by every pair of the step and weighted negatives/S, so each pair still counts as
        `negatives` draws in expectation (one (P, D) × (D, S) product instead of P·K gathered rows)."""
        u = self.words[centers]  # (P, D)
        positive = (u * self.contexts[contexts]).sum(-1)  # (P,)
        negative = u @ self.contexts[noise].T  # (P, S)
        return -(F.logsigmoid(positive) + F.logsigmoid(-negative).sum(-1) * (negatives / len(noise))).mean()


def skipgram_vectors(ids: torch.Tensor, offsets: torch.Tensor, vocab_size: int, dim: int, epochs: int = 5,
                     window: int = 5, negatives: int = 5, subsample: float = 1e-4, lr: float = 0.01,
                     chunk: int = 4096, seed: int = 0) -> torch.Tensor:
    """(vocab_size, dim) word vectors of the texts ids[offsets[i]:offsets[i + 1]], rows of [PAD], [UNK] and of
    words never seen left at their small random start. The step size decays linearly to zero over the epochs."""
    if epochs < 1 or window < 1 or negatives < 1 or chunk < 2:
        raise ValueError(f"epochs, window, negatives must be at least 1 and chunk 2, got {epochs}, {window}, "
                         f"{negatives}, {chunk}")
    generator = torch.Generator().manual_seed(seed)
    ids = ids.long()
    lengths = offsets[1:] - offsets[:-1]
    text = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # (T,) which text each token is in
    counts = torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    counts[:FIRST_WORD_ID] = 0  # the special tokens ([PAD], [UNK]) are no word: never trained
    if int(counts.sum()) < 2:
        raise ValueError("skip-gram word vectors need at least two known words in the training texts")
    keep = keep_probability(counts, subsample)  # (V,), 0 for [PAD] and [UNK]
    keep[counts == 0] = 0.0
    noise = counts.double() ** 0.75  # the noise distribution of word2vec

    model = SkipGram(vocab_size, dim, generator)
    # Dense Adam, fused: as fast a step here as SparseAdam on the touched rows (CPU), and simpler.
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    # Steps are counted on the expected thinned stream, for the linear decay of the step size.
    steps_per_epoch = max(1, math.ceil(float(keep[ids].sum()) / chunk))
    total = epochs * steps_per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / total))
    start, step = time.perf_counter(), 0
    for epoch in range(epochs):
        order = torch.randperm(len(lengths), generator=generator)  # texts in a new order each epoch
        starts = offsets[:-1][order]
        first = torch.repeat_interleave(starts - (lengths[order].cumsum(0) - lengths[order]), lengths[order])
        stream = first + torch.arange(len(ids))  # (T,) token positions, text by text in that order
        stream = stream[torch.rand(len(stream), generator=generator) < keep[ids[stream]]]
        losses = []
        for a in range(0, len(stream), chunk):
            piece = stream[a : a + chunk]
            centers, contexts = window_pairs(ids[piece], text[piece], window, generator)
            if len(centers) == 0:
                continue
            drawn = torch.multinomial(noise, NOISE_WORDS, replacement=True, generator=generator)
            loss = model(centers, contexts, drawn, negatives)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step < total:
                schedule.step()
            step += 1
            losses.append(loss.item())
        elapsed = time.perf_counter() - start
        log.info("word vectors: epoch %d of %d, skip-gram loss %.3f, %.0f s (about %.0f s left)", epoch + 1, epochs,
                 sum(losses) / max(1, len(losses)), elapsed, elapsed / (epoch + 1) * (epochs - epoch - 1))
    return model.words.detach().clone()


def starting_embedding(split, network, epochs: int = 5, seed: int = 0) -> torch.Tensor:
    """(vocab_size, d_model) skip-gram vectors of an EncodedSplit's texts, scaled to the spread the network's own
    embedding starts with (network.embedding_std, a NetworkConfig), so they enter at the size the rest of the
    network expects. Deterministic: the same texts, settings and seed give the same table (on one machine)."""
    table = skipgram_vectors(split.ids, split.offsets, network.vocab_size, network.d_model, epochs=epochs, seed=seed)
    return table / table.std() * network.embedding_std


def start_from_word_vectors(networks, split, config, epochs: int) -> None:
    """Before the first step of a fresh fit (model.word_vectors): skip-gram vectors of the training texts (split:
    an EncodedSplit; config: the NetworkConfig) as the token embedding's start of each of `networks`."""
    log.info("word vectors: %d skip-gram epochs on the %d training texts (%d tokens) before the first step",
             epochs, len(split), len(split.ids))
    seed = int(torch.randint(2**31 - 1, ()))  # from the run's seed (seed_everything)
    table = starting_embedding(split, config, epochs=epochs, seed=seed)
    with torch.no_grad():
        for network in networks:
            network.token_embedding.weight.copy_(table)
