"""Data: sources (hub, local copy, own files, synthetic) → tokenizer → length-bucketed batches.

`from data import TextDataModule` imports Lightning; `data.tokenizer` and `data.sources` do not, so the network
and inference can use the token ids (`data.tokenizer.PAD_ID`, `UNK_ID`) without it.
"""

from data.sources import DATA_ROOT_ENV, DataError

__all__ = ["TextDataModule", "DataError", "DATA_ROOT_ENV"]


def __getattr__(name):
    if name == "TextDataModule":  # imported on first use: it pulls in Lightning
        from data.datamodule import TextDataModule

        return TextDataModule
    raise AttributeError(f"module 'data' has no attribute {name!r}")
