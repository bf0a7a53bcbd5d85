"""Data: sources (hub, local copy, own files, synthetic) → tokenizer → length-bucketed batches."""

from data.datamodule import TextDataModule
from data.sources import DATA_ROOT_ENV, DataError

__all__ = ["TextDataModule", "DataError", "DATA_ROOT_ENV"]
