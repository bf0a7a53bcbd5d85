"""From scratch against pretrained, per dataset, next to the n-gram peers, with minutes per stage:

    python -m bench.pretraining --datasets chnsenticorp_htl --seeds 0 1 2
    python -m bench.pretraining --datasets chnsenticorp_htl --settings scratch pretrained_unlabeled --seeds 0 \\
        --pretrain-minutes 20 -- --trainer.max_epochs 8
    python -m bench.pretraining --reproduce imdb --seed 0                 # bench/reproduce.sh: last line test_acc

Settings, each fine-tuned with `train.py fit --data.dataset <name>` and no config (the generic default, as a user
without a config gets it) for every seed, its best-validation checkpoint scored once on the reported split (test
where the data have one, else validation; bench/accuracy.py):
    scratch               no initialisation
    pretrained_train      `train.py pretrain` (configs/pretrain.yaml) on the training split's own texts
    pretrained_unlabeled  the same, plus the dataset's unlabeled files (UNLABELED below)
    skipgram_unlabeled    the baseline: skip-gram word vectors (training/word_vectors.py, seed 0, deterministic)
                          of the same text with the same tokenizer, as the token embedding's starting values
                          (attention blocks from scratch)
The pretraining run (or the word-vector run) gets the network of the fine-tuning arguments after `--` (network_args:
`-- --config configs/imdb.yaml` pretrains configs/imdb.yaml's network), so the checkpoint fits what starts from it.
One pretraining run per setting and dataset, reused while one with the same settings is on disk (its folder is
named by a hash of them). Minutes per stage: config.yaml written → last event of the run.

The peers' fastText classifier needs the `bench` extra (fasttext-numpy2); --model-only and --reproduce do not.
Runs use Lightning's accelerator "auto": the GPU where CUDA is present.
"""

import argparse
import hashlib
import json
import logging
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from bench.accuracy import fasttext_accuracy, nb_logreg, report_split, score_run, tfidf_logreg
from bench.common import network_config
from data.checkpoint import CheckpointError
from data.files import WriteError
from data.sources import DATA_ROOT_ENV, DataError, load_splits
from model.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PRETRAIN_CONFIG = ROOT / "configs" / "pretrain.yaml"
DEFAULT_CONFIG = ROOT / "configs" / "default.yaml"  # what `train.py fit` reads without a --config
# Unlabeled text per dataset, under $ATTENTION_DATA_ROOT (../shared/data on the development machines).
UNLABELED = {"chnsenticorp_htl": ["chinese_reviews_unlabeled/unlabeled.parquet"], "imdb": ["imdb/unsup.parquet"],
             "sst2": []}
SETTINGS = ("scratch", "pretrained_train", "pretrained_unlabeled", "skipgram_unlabeled")
WORD_VECTOR_EPOCHS, WORD_VECTOR_SEED = 5, 0  # one table of vectors per dataset and network, shared by every seed
# What bench/reproduce.sh runs per dataset: the setting of the headline figure (README "Pretraining on unlabeled
# text") and the fine-tuning arguments. IMDB starts from skip-gram vectors of train + unlabeled reviews; its
# word-vector run is given the network of its fine-tuning configs (network_args), since the vectors must fit it.
RECIPES = {
    "chnsenticorp_htl": {"setting": "scratch", "fit": []},  # the generic default from scratch (docs/RESULTS.md)
    "sst2": {"setting": "scratch", "fit": ["--config", "configs/sst2.yaml"]},
    "imdb": {"setting": "skipgram_unlabeled",
             "fit": ["--config", "configs/imdb.yaml", "--config", "configs/imdb_local.yaml"]},
}
log = logging.getLogger("bench.pretraining")


def unlabeled_files(dataset: str) -> list[str]:
    root = Path(os.environ.get(DATA_ROOT_ENV, ROOT.parent / "shared" / "data"))
    return [str(root / name) for name in UNLABELED.get(dataset, [])]


def network_args(fit_args: list[str]) -> list[str]:
    """`train.py pretrain` arguments that give configs/pretrain.yaml the network of the fine-tuning run `fit_args`
    make (its --config files, or configs/default.yaml without one, then its --model.network.* and --data.vocab_size /
    --data.max_length flags): the settings a pretrained or word-vector checkpoint must share with the network it
    starts (ENCODER_SETTINGS), and the embedding's starting spread. Only what differs from pretrain.yaml."""
    from training.encoder import ENCODER_SETTINGS

    configs = [value for arg, value in zip(fit_args, fit_args[1:]) if arg == "--config"]
    configs += [arg.removeprefix("--config=") for arg in fit_args if arg.startswith("--config=")]
    flags = {arg.removeprefix("--model.network.").removeprefix("--data."): yaml.safe_load(value)
             for arg, value in zip(fit_args, fit_args[1:])
             if arg.startswith("--model.network.") or arg in ("--data.vocab_size", "--data.max_length")}
    fit = network_config(*(ROOT / path for path in configs or [DEFAULT_CONFIG]), **flags)  # train.py runs in ROOT
    pretrain = network_config(PRETRAIN_CONFIG)
    args = []
    for name in (*ENCODER_SETTINGS, "embedding_std"):
        value = getattr(fit, name)
        if value != getattr(pretrain, name):
            flag = f"--data.{name}" if name in ("vocab_size", "max_length") else f"--model.network.{name}"
            args += [flag, value if isinstance(value, str) else json.dumps(value)]
    return args


def pretrain_args(dataset: str, setting: str, minutes: float | None, extra: list[str]) -> list[str]:
    args = ["--config", str(PRETRAIN_CONFIG), "--data.dataset", dataset, *extra]
    if setting.endswith("_unlabeled") and unlabeled_files(dataset):
        args += ["--data.unlabeled_files", json.dumps(unlabeled_files(dataset))]
    if minutes:
        args += ["--trainer.max_time", time.strftime("00:%H:%M:%S", time.gmtime(minutes * 60))]
    return args


def run_folder(out: Path, stage: str, args: list[str]) -> Path:
    """A folder named by the stage and a hash of its arguments: the same settings find the same run."""
    return out / f"{stage}-{hashlib.sha256(json.dumps(args).encode()).hexdigest()[:12]}"


def run(command: list[str], threads: int | None) -> None:
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    log.info("running %s", " ".join(command))
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        if lines and lines[-1].startswith("error: "):  # train.py's one line for bad input: it says what to do
            raise SystemExit(f"{lines[-1]} (from: {' '.join(command)})")
        raise SystemExit(f"failed: {' '.join(command)}\n{result.stderr[-3000:]}")


def finished_run(folder: Path) -> Path | None:
    """The newest run in `folder` that wrote its DONE mark (an interrupted one is resumed, not reused)."""
    runs = sorted(folder.glob("lightning_logs/version_*/DONE"), key=lambda p: p.stat().st_mtime)
    return runs[-1].parent if runs else None


def minutes_of(run_dir: Path) -> float:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    last = max(event.wall_time for tag in events.Tags()["scalars"] for event in events.Scalars(tag))
    return round((last - (run_dir / "config.yaml").stat().st_mtime) / 60, 1)


def pretrained_checkpoint(dataset: str, setting: str, out: Path, minutes: float | None, extra: list[str],
                          threads: int | None) -> tuple[Path, float]:
    """The pretraining (or word-vector) checkpoint of a setting, made unless one with the same settings exists;
    and the minutes it took."""
    args = pretrain_args(dataset, setting.replace("skipgram", "pretrained"), minutes, extra)
    if setting.startswith("skipgram"):
        folder = run_folder(out, "skipgram", args)
        checkpoint = folder / "word_vectors.ckpt"
        if not checkpoint.exists():
            start = time.perf_counter()
            word_vector_checkpoint(args, checkpoint, threads)
            (folder / "minutes").write_text(f"{(time.perf_counter() - start) / 60:.1f}")
        return checkpoint, float((folder / "minutes").read_text())
    folder = run_folder(out, "pretrain", args)
    done = finished_run(folder)
    if done is None:
        resume = ["--ckpt_path", "last"] if list(folder.glob("lightning_logs/version_*/checkpoints/last.ckpt")) else []
        run([sys.executable, "train.py", "pretrain", *args, "--trainer.default_root_dir", str(folder),
             "--trainer.enable_progress_bar", "false", *resume], threads)
        done = max(folder.glob("lightning_logs/version_*"), key=lambda p: p.stat().st_mtime)
        (done / "DONE").touch()
    return done / "checkpoints" / "last.ckpt", minutes_of(done)


def word_vector_checkpoint(pretrain_arguments: list[str], target: Path, threads: int | None = None) -> None:
    """The word-vector baseline as a pretraining checkpoint: skip-gram vectors (training/word_vectors.py, dimension
    d_model, WORD_VECTOR_EPOCHS epochs, WORD_VECTOR_SEED) of the tokens of the pretraining text, tokenized by the
    tokenizer `train.py pretrain` would build from it, as the token embedding; the attention blocks as freshly
    initialised. `train.py fit --model.init_from` takes it like any other. Written in one piece (data/files.py):
    an interrupted run leaves no half file to be reused."""
    import train
    from data.files import write_atomically
    from training.word_vectors import starting_embedding

    if threads:
        torch.set_num_threads(threads)
    cli = train.cli(["pretrain", *pretrain_arguments], run=False)
    data, network = cli.datamodule, cli.model.network
    state = cli.model.state_dict()
    state["model.token_embedding.weight"] = starting_embedding(data.split("train"), network,
                                                               epochs=WORD_VECTOR_EPOCHS, seed=WORD_VECTOR_SEED)
    checkpoint = {
        "state_dict": state, "global_step": 0, "epoch": 0,
        "hyper_parameters": {**dict(cli.model.hparams), "objective": "skip-gram word vectors"},
        "PretrainDataModule": data.state_dict(),
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, lambda temporary: torch.save(checkpoint, temporary), "word-vector checkpoint")


@torch.no_grad()
def fine_tune(dataset: str, setting: str, seed: int, out: Path, init_from: Path | None, fit_args: list[str],
              threads: int | None) -> Path:
    args = ["--data.dataset", dataset, "--seed_everything", str(seed), *fit_args]
    if init_from is not None:
        args += ["--model.init_from", str(init_from)]
    folder = run_folder(out, f"fit-{setting}-seed{seed}", args)
    done = finished_run(folder)
    if done is None:
        run([sys.executable, "train.py", "fit", *args, "--trainer.default_root_dir", str(folder),
             "--trainer.enable_progress_bar", "false"], threads)
        done = max(folder.glob("lightning_logs/version_*"), key=lambda p: p.stat().st_mtime)
        (done / "DONE").touch()
    return done


def measure(dataset: str, settings: list[str], seeds: list[int], out: Path, args) -> dict:
    splits = load_splits(dataset=dataset, data_dir=None, train_file=None, val_file=None, test_file=None,
                         text_column=None, label_column=None, val_fraction=0.1, seed=0)
    split = report_split(splits)
    row = {"split": split, "texts": len(splits.texts[split]), "peers": {}, "settings": {}}
    if not args.model_only:
        for peer, score in (("tfidf_logreg", tfidf_logreg), ("nb_logreg", nb_logreg), ("fasttext", fasttext_accuracy)):
            start = time.perf_counter()
            row["peers"][peer] = {"accuracy": score(splits, split), "minutes": (time.perf_counter() - start) / 60}
    for setting in settings:
        init, pretrain_minutes = None, 0.0
        if setting != "scratch":
            init, pretrain_minutes = pretrained_checkpoint(dataset, setting, out, args.pretrain_minutes,
                                                           [*network_args(args.extra), *args.pretrain_args],
                                                           args.threads)
        runs = [score_run(fine_tune(dataset, setting, seed, out, init, args.extra, args.threads), split)
                for seed in seeds]
        row["settings"][setting] = {"pretrain_minutes": pretrain_minutes, "runs": runs,
                                    "accuracy": statistics.median(r["accuracy"] for r in runs)}
    return row


def print_table(results: dict) -> None:
    print("\n| dataset (split) | model | accuracy (median) | seeds | pretraining min | fine-tuning min (median) |"
          "\n|---|---|---:|---|---:|---:|")
    for dataset, row in results.items():
        where = f"{dataset} ({row['split']}, {row['texts']})"
        for setting, figures in row["settings"].items():
            seeds = ", ".join(f"{100 * r['accuracy']:.2f}" for r in figures["runs"])
            minutes = statistics.median(r["minutes"] for r in figures["runs"])
            print(f"| {where} | {setting} | **{100 * figures['accuracy']:.2f}** | {seeds} | "
                  f"{figures['pretrain_minutes']:.1f} | {minutes:.1f} |")
        for peer, figures in row["peers"].items():
            print(f"| {where} | {peer} | {100 * figures['accuracy']:.2f} | | | {figures['minutes']:.1f} |")


def reproduce(dataset: str, seed: int, out: Path, threads: int | None, extra: list[str]) -> None:
    """One dataset's headline figure with its recipe (RECIPES); `extra` train.py fit arguments go after the
    recipe's (and, where they set the network, to the pretraining or word-vector run too)."""
    recipe = RECIPES[dataset]
    fit = [*recipe["fit"], *extra]
    missing = [path for path in unlabeled_files(dataset) if not Path(path).exists()]
    if recipe["setting"].endswith("_unlabeled") and missing:
        raise SystemExit(f"error: {missing[0]}: file not found; the {dataset} recipe reads its unlabeled texts there: "
                         f"set {DATA_ROOT_ENV} to the folder that holds {UNLABELED[dataset][0]}")
    init = None
    if recipe["setting"] != "scratch":
        init, _ = pretrained_checkpoint(dataset, recipe["setting"], out, None, network_args(fit), threads)
    run_dir = fine_tune(dataset, recipe["setting"], seed, out, init, fit, threads)
    splits = load_splits(dataset=dataset, data_dir=None, train_file=None, val_file=None, test_file=None,
                         text_column=None, label_column=None, val_fraction=0.1, seed=0)
    split = report_split(splits)
    scored = score_run(run_dir, split)
    print(json.dumps(scored))
    print(f"{'test' if split == 'test' else 'val'}_acc {scored['accuracy']:.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(UNLABELED), choices=list(UNLABELED))
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "pretraining")
    parser.add_argument("--pretrain-minutes", type=float, default=None,
                        help="stop pretraining after this many minutes (trainer.max_time); default: its epochs")
    parser.add_argument("--pretrain-args", type=shlex.split, default=[],
                        help='more `train.py pretrain` arguments, one string: "--model.objective replaced"')
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run (%(default)s)")
    parser.add_argument("--model-only", action="store_true", help="no peers")
    parser.add_argument("--reproduce", choices=list(RECIPES), help="one dataset's headline figure (reproduce.sh)")
    parser.add_argument("--seed", type=int, default=0, help="with --reproduce: the fine-tuning seed")
    parser.add_argument("extra", nargs="*", help="more `train.py fit` arguments after --")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.reproduce:
            return reproduce(args.reproduce, args.seed, args.out, args.threads, args.extra)
        results = {name: measure(name, args.settings, args.seeds, args.out, args) for name in args.datasets}
    except (DataError, ConfigError, CheckpointError, WriteError) as e:  # in this process: the word-vector run
        raise SystemExit(f"error: {e}") from None
    print_table(results)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
