"""What a fit does before its first step, apart from the network it starts (ClassifierModule attaches it):

    setup         model.init_from: the embedding and attention blocks of a pretraining checkpoint
                  (training/encoder.py), before Lightning restores a --ckpt_path (which then overwrites them)
    on_fit_start  the class weights of the loss from the training labels (training/class_weights.py); then
                  model.word_vectors: skip-gram vectors of the training texts as the token embedding
                  (training/word_vectors.py), and model.ngram_start: the n-gram branch from naive-Bayes weights of the
                  training texts (training/ngram_start.py), only on a fresh fit: a resumed run keeps its checkpoint's
                  weights; network.ngram_fitted: the n-gram bag's regression fitted on the training texts (fresh fit)
                  and its out-of-fold logits attached to the training split (every fit, resumed too:
                  training/ngram_fit.py)
"""

import lightning as L

from model.config import ConfigError
from training.average import networks
from training.class_weights import choose_loss_weights
from training.encoder import load_encoder
from training.ngram_fit import fit_ngram_bag
from training.ngram_start import start_from_naive_bayes
from training.word_vectors import start_from_word_vectors


def check_starting_weights(word_vectors: int, init_from: str | None) -> None:
    if word_vectors < 0:
        raise ConfigError(f"model.word_vectors must be 0 (off) or a number of epochs, got {word_vectors}")
    if word_vectors and init_from:
        raise ConfigError("model.word_vectors and model.init_from both set the starting embedding: give one")


class StartOfFit(L.Callback):
    def setup(self, trainer, pl_module, stage):
        if stage == "fit" and pl_module.hparams.init_from:
            for network in networks(pl_module):
                load_encoder(network, pl_module.hparams.init_from)

    def on_fit_start(self, trainer, pl_module):
        hparams, data = pl_module.hparams, getattr(trainer, "datamodule", None)
        pl_module.loss_weights = choose_loss_weights(hparams.class_weights, hparams.multi_label, data,
                                                     pl_module.label_names, pl_module.device)
        if hparams.word_vectors and trainer.ckpt_path is None:  # trainer.ckpt_path is set by now
            start_from_word_vectors(networks(pl_module), data.split("train"), pl_module.network, hparams.word_vectors)
        if hparams.get("ngram_start") and pl_module.network.ngrams and trainer.ckpt_path is None:
            start_from_naive_bayes(networks(pl_module), data.split("train"), hparams.ngram_start,
                                   hparams.multi_label)
        if pl_module.network.ngram_fitted:
            train = data.split("train")
            train.ngram_logits = fit_ngram_bag(networks(pl_module), train, hparams.multi_label, data.hparams.seed,
                                               balanced=pl_module.loss_weights is not None,
                                               fit_whole=trainer.ckpt_path is None,
                                               cache_dir=data.hparams.get("cache_dir"),
                                               weighting=pl_module.network.ngram_weighting)
