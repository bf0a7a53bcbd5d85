"""What the benches share: a config file's network, a run's best checkpoint, and the n-gram recipe.

    python -m bench.common best-checkpoint lightning_logs/version_0    # prints the run's best checkpoint

The TF-IDF + logistic regression peer is the teacher that `data.teacher: ngram` distills from, fitted by the same
function (data/teacher.py: fit_ngram_teacher): character 1-3-grams for Chinese, Japanese or Korean text, word
1-2-grams otherwise (words of one letter or more: on SST-2 validation 82.1% against 82.2% for two letters or more,
on IMDB test 90.4% against 90.3%).
"""

import argparse
import sys
from pathlib import Path

import yaml

from data.teacher import fit_ngram_teacher, is_cjk
from data.checkpoint import CheckpointError, best_checkpoint
from model.config import NetworkConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

__all__ = ["ROOT", "CONFIGS", "read_config", "network_config", "best_checkpoint", "fit_ngram_teacher", "is_cjk"]


def merged(base: dict, overlay: dict) -> dict:
    """`overlay` on top of `base`, nested sections merged key by key (as train.py merges several --config files)."""
    result = dict(base)
    for key, value in overlay.items():
        result[key] = merged(result[key], value) if isinstance(value, dict) and isinstance(result.get(key), dict) \
            else value
    return result


def read_config(*paths) -> dict:
    """Config files merged in order, later ones winning, as `train.py fit --config a --config b` reads them."""
    config = {}
    for path in paths:
        config = merged(config, yaml.safe_load(Path(path).read_text()) or {})
    return config


def network_config(*paths, **overrides) -> NetworkConfig:
    """The NetworkConfig of these config files: their `model: network:` section, with `data.vocab_size` and
    `data.max_length` where the files set them (train.py takes the tokenizer's size and the data's length), then
    `overrides`. A bad value is model.config.ConfigError."""
    config = read_config(*paths)
    network = dict((config.get("model") or {}).get("network") or {})
    data = config.get("data") or {}
    network |= {key: data[key] for key in ("vocab_size", "max_length") if data.get(key) is not None}
    return NetworkConfig.from_dict(network | overrides)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    best = commands.add_parser("best-checkpoint", help="the run's checkpoint with the best recorded monitored metric")
    best.add_argument("run", type=Path, help="a run folder (lightning_logs/version_N) or its checkpoints/")
    args = parser.parse_args(argv)
    try:
        print(best_checkpoint(args.run))
    except CheckpointError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
