"""The LightningCLI of train.py: `CLI` for fit, validate, test and predict of the classifier, `PretrainCLI` for
`train.py pretrain`. What they add to Lightning's: the sizes the data decide linked into the network, early stopping
on the figure the data call for, the training length chosen from the data (training/length.py), `--ckpt_path last`
and a run's checkpoint worked on in that run's folder (training/runs.py), and a checkpoint checked against the config
before anything is written (training/checkpoints.py).
"""

import logging
from pathlib import Path

from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from data import DataError
from data.checkpoint import CheckpointError, load_safely, read_checkpoint, read_pretraining_checkpoint
from data.datamodule import NO_TEST_SPLIT
from data.labels import monitored_metric
from data.pretraining import check_known
from model.config import ConfigError, NetworkConfig, max_length_caps
from model.kinds import find_kind, kinds_help
from model.own_attention import named_network
from training.checkpoints import SPECIAL_NAMES, check_fits, check_pretraining_fits, check_restorable, resolve
from training.encoder import check_pretrained
from training.length import training_epochs
from training.runs import test_after_fit, version_of
from training.teacher import attach_teacher

log = logging.getLogger("train")

AUTO_MONITOR = "auto"  # early_stopping.monitor's default: chosen from the data (CLI.choose_monitor)
# The callbacks of a run whose config lists none: the attention monitor, and memory kept flat when batches come in
# many lengths (training/memory.py: large blocks mapped on their own, the heap's free pages handed back).
DEFAULT_CALLBACKS = [{"class_path": "monitor.AttentionMonitor"}, {"class_path": "training.memory.ReturnFreedMemory"}]
BEST_NAME = "best-epoch{epoch}-step{step}-acc{val/acc:.4f}"


def check_network(config) -> None:
    """The network's own rules (model/config.py), checked before the data are read: tokenizing IMDB must not end in
    "window must be a whole number >= 1". Sizes the data will choose stand in so that no rule refuses wrongly:
    max_length as the most it may be, vocab_size as the least (the network is checked again once both are known)."""
    network, data = config["model"]["network"], config["data"]
    settings = {**vars(network), "num_classes": 2, "vocab_size": data.get("vocab_size") or 1,
                "max_length": data.get("max_length") or max(max_length_caps(network.attention))}
    NetworkConfig(**settings)


def named_on_command(config) -> str | None:
    """The user's class the command names (--model.network.attention, or the --config it gives), read before
    LightningCLI replaces the network settings with a --ckpt_path's: the only class a run may import."""
    config = config[config["subcommand"]] if config.get("subcommand") else config
    network = config["model"]["network"]
    kind = find_kind(network.attention)
    if kind is not None and kind.names_code and network.attention_source is None:
        return network.attention
    return None


def name_checkpoint_class(config, named: str | None) -> None:
    """A --ckpt_path's network of a user's class gets the class the command named (`named`), its file's hash
    checked against the checkpoint's record; none named: one line saying which class and the flag. A checkpoint's
    own spec is never imported (model/own_attention/naming.py)."""
    network = config["model"]["network"]
    if network.attention_source is None:
        return
    settings = named_network(vars(network), named, flag="--model.network.attention")
    network.attention_source = settings["attention_source"]


def list_kinds(parser) -> None:
    """--help names the attention kinds registered when it is asked for (model/kinds.py), not a copy of them."""
    action = parser._option_string_actions["--model.network.attention"]
    action.help = f"{action.help} Kinds: {kinds_help()}."


class CLI(LightningCLI):
    def add_arguments_to_parser(self, parser):
        list_kinds(parser)
        # Sizes the data decides travel to the model; the user never types them twice. Read from the DataModule
        # once it exists, since left unset they are chosen from the training texts.
        parser.link_arguments("data.max_length", "model.network.max_length", apply_on="instantiate")
        parser.link_arguments("data.vocab_size", "model.network.vocab_size", apply_on="instantiate")  # tokenizer ≤ it
        # The attention kind decides how long an unset max_length may be (whole long texts for the cheaper kinds).
        parser.link_arguments("model.network.attention", "data.max_length_caps", compute_fn=max_length_caps)
        # Fine-tuning from a pretraining checkpoint reads text with that checkpoint's tokenizer.
        parser.link_arguments("model.init_from", "data.tokenizer_from")
        parser.link_arguments("data.label_names", "model.label_names", apply_on="instantiate")
        parser.link_arguments("data.label_names", "model.network.num_classes", compute_fn=len, apply_on="instantiate")
        parser.link_arguments("data.multi_label", "model.multi_label", apply_on="instantiate")
        # Stop when the monitored validation figure has not improved for `patience` epochs; the best checkpoint is
        # kept. "auto": macro-F1 when the classes are imbalanced or several a text, else accuracy (data/labels.py).
        parser.add_lightning_class_args(EarlyStopping, "early_stopping")
        # strict=False: a run without validation (--trainer.limit_val_batches 0) trains on instead of failing.
        parser.set_defaults({"early_stopping.monitor": AUTO_MONITOR, "early_stopping.mode": "max",
                             "early_stopping.patience": 5, "early_stopping.strict": False})
        # On unless a config lists its own callbacks (the shipped ones list the monitor too, the IMDB ones both).
        parser.set_defaults({"trainer.callbacks": DEFAULT_CALLBACKS})

    def init_parser(self, **kwargs):
        """Each parser of this command line (the main one, then one per subcommand) knows the others, so an error the
        main one reports can name the options of the subcommand given (training/cli.py)."""
        parser = super().init_parser(**kwargs)
        if not hasattr(self, "parsers"):
            self.parsers = []
        self.parsers.append(parser)
        parser.family = self.parsers
        return parser

    def parse_arguments(self, parser, args):
        # train.py always hands the arguments over (never rewriting sys.argv), so LightningCLI's warning about args
        # given beside a command line does not apply: its parse, without that warning.
        self.config = parser.parse_args(args)
        self.named_class = named_on_command(self.config)
        # LightningCLI then reads the checkpoint's hyperparameters into the config (so `validate --ckpt_path X`
        # rebuilds X's network); make sure first that the file is a safe, readable checkpoint of this project.
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and ckpt_path not in SPECIAL_NAMES:
            self.read(ckpt_path)

    def read(self, path) -> dict:
        """The checkpoint at `path`, read safely and checked that Lightning can restore it, once per run (train.py needs it at
        parse time and again before the run starts; Lightning then restores it itself)."""
        path = Path(path)
        cached = getattr(self, "checkpoint", None)
        if cached is None or cached[0] != path.resolve():
            self.checkpoint = (path.resolve(), self.load_checkpoint(path))
        return self.checkpoint[1]

    def load_checkpoint(self, path: Path) -> dict:
        checkpoint = read_checkpoint(path)
        check_restorable(path, checkpoint)
        return checkpoint

    def before_instantiate_classes(self):
        config = self.config[self.subcommand] if self.subcommand else self.config
        name_checkpoint_class(config, getattr(self, "named_class", None))
        check_network(config)
        if self.subcommand in ("fit", None) and config["model"].get("distillation", 0) > 0 \
                and not config["data"]["teacher"]:
            raise ConfigError(f"model.distillation {config['model']['distillation']} needs a teacher: "
                              "set data.teacher ngram (or model.distillation 0)")
        logger = config["trainer"]["logger"]
        logger_args = logger["init_args"] if isinstance(logger, dict) or hasattr(logger, "init_args") else None
        # --trainer.default_root_dir DIR holds everything, as Lightning users expect: the logger's default "." is
        # relative to it (checkpoints go under the logger's folder).
        root = config["trainer"].get("default_root_dir")
        if root and logger_args is not None and logger_args.get("save_dir") in (None, "."):
            logger_args["save_dir"] = root
        if config.get("ckpt_path") == "best":  # Lightning's name for the best checkpoint of a fit in this process
            raise CheckpointError("--ckpt_path best: there is no fit in this process to take the best checkpoint of; "
                                  "give its file (lightning_logs/version_N/checkpoints/best-*.ckpt) or last")
        # `--ckpt_path last` resumes the newest run: log into that run's version so its last.ckpt is found.
        ckpt_path, resumed = config.get("ckpt_path"), None
        runs = Path(logger_args.get("save_dir") or ".") / (logger_args.get("name") or "lightning_logs") \
            if logger_args is not None else None
        if ckpt_path == "last" and logger_args is not None and logger_args.get("version") is None:
            resumable = sorted(runs.glob("version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
            if resumable:
                logger_args["version"] = resumable[-1].parent.parent.name
                resumed = resumable[-1]
            elif self.subcommand in ("fit", None):
                log.warning("--ckpt_path last: no run under %s has a last.ckpt yet (stopped before its first "
                            "checkpoint?): starting a fresh run", runs)
            else:  # validating, testing or predicting with random weights would look like a result
                raise CheckpointError(f"--ckpt_path last: no run under {runs} has a last.ckpt, so there is nothing to "
                                      f"{self.subcommand}; train first, or give a checkpoint file")
        elif ckpt_path and ckpt_path not in SPECIAL_NAMES:
            resumed = ckpt_path
            if logger_args is not None and logger_args.get("version") is None and version_of(ckpt_path, runs):
                # A checkpoint of one of these runs: work in its run, as `last` does (training/runs.py).
                logger_args["version"] = version_of(ckpt_path, runs)
        class_path = str(logger.get("class_path", "")) if logger_args is not None else ""
        if self.subcommand == "fit" and resumed is not None and class_path.endswith("TensorBoardLogger"):
            # Resuming: hide what an interrupted run logged after this checkpoint, so no step appears twice.
            # TensorBoardLogger hands its extra keyword arguments to the SummaryWriter it creates.
            step = self.read(resumed).get("global_step")
            if step is not None:  # a weights-only checkpoint has none (and is refused for fit in before_fit)
                logger_args["purge_step"] = step

    def after_instantiate_classes(self):
        if self.subcommand in ("fit", None):  # a fit's first step: the teacher's answers for its training batches
            attach_teacher(self.datamodule)

    def instantiate_trainer(self, **kwargs):
        # The data are read by now (the links above built them). What was chosen from them goes into the config
        # that SaveConfigCallback writes as config.yaml, as concrete numbers.
        config = self.config[self.subcommand] if self.subcommand else self.config
        config["data"]["max_length"] = self.datamodule.max_length
        config["data"]["vocab_size"] = self.datamodule.vocab_size
        config["data"]["bucket_pool"] = self.datamodule.bucket_pool
        config["data"]["data_dir"] = self.datamodule.hparams.data_dir  # the local copy read, when none was given
        monitor = self.choose_monitor(config)
        trainer = config["trainer"]
        if self.subcommand in ("fit", None) and trainer.get("max_epochs") is None and trainer.get("max_steps") in (None, -1):
            trainer["max_epochs"] = kwargs["max_epochs"] = self.training_epochs(config)
        trainer = super().instantiate_trainer(**kwargs)
        for callback in trainer.callbacks:  # the best checkpoint is chosen on the same figure
            if isinstance(callback, ModelCheckpoint) and callback.monitor == "val/acc":
                callback.monitor = monitor
                callback.filename = BEST_NAME.replace("acc{val/acc", f"{monitor[4:]}{{{monitor}")
        return trainer

    def choose_monitor(self, config) -> str:
        """early_stopping.monitor "auto" → val/f1 (macro) when the classes are imbalanced or several a text, else
        val/acc; logged, and written into config.yaml."""
        stopping = config.get("early_stopping")
        init = self.config_init[self.subcommand] if self.subcommand else self.config_init
        stopper = init.get("early_stopping")
        monitor = stopping.get("monitor") if stopping else None
        data = self.datamodule
        if not hasattr(data, "imbalanced"):  # pretraining: its own checkpoint monitor (val/loss)
            return monitor
        if monitor in (None, AUTO_MONITOR):
            monitor = monitored_metric(data.imbalanced)
            log.info("monitored metric %s (checkpoint selection%s): %s", monitor, " and early stopping" if stopping
                     else "", "several labels a text" if data.multi_label else
                     "classes imbalanced" if data.imbalanced else "classes balanced")
            if stopping:
                stopping["monitor"] = monitor
            if stopper is not None:
                stopper.monitor = monitor
        return monitor

    def training_epochs(self, config) -> int:
        init = self.config_init[self.subcommand] if self.subcommand else self.config_init
        return training_epochs(len(self.datamodule.split("train")), self.datamodule.hparams.batch_size,
                               config["trainer"].get("accumulate_grad_batches"), config.get("early_stopping"),
                               init.get("early_stopping"))

    def before_fit(self):
        # Before anything is written (config.yaml included): the checkpoint must be safe to read and fit this
        # config and data, else one line says what differs.
        path = resolve(self.config[self.subcommand].get("ckpt_path"), self.trainer)
        if path is not None:
            check_fits(path, self.read(path), self.model.network, self.datamodule.label_names,
                       resume=self.subcommand == "fit")
        if self.subcommand == "fit" and self.model.hparams.init_from:
            check_pretrained(self.model.hparams.init_from, self.model.network)
            check_known(self.datamodule.split("train"), self.model.hparams.init_from)
        self.checkpoint = None  # Lightning restores it from the file; no need to hold it for the whole run

    def before_test(self):
        # Before the logger makes the run's folder: a test with nothing to test leaves no version_N behind.
        if "test" not in self.datamodule.state["splits"]:
            raise DataError(NO_TEST_SPLIT)
        self.before_fit()

    before_validate = before_predict = before_fit

    def after_fit(self):
        """The last line of a fit: which checkpoint is best, by what score, and where it is."""
        best = next((c for c in self.trainer.checkpoint_callbacks if c.monitor and c.best_model_path), None)
        if best is not None and self.trainer.is_global_zero:
            log.info("best checkpoint: %s (%s %.4f)", best.best_model_path, best.monitor, float(best.best_model_score))
        test_after_fit(self)


class PretrainCLI(CLI):
    """`train.py pretrain`: `fit` of PretrainModule on PretrainDataModule, with the conventions of CLI."""

    def add_arguments_to_parser(self, parser):
        list_kinds(parser)
        parser.link_arguments("data.max_length", "model.network.max_length", apply_on="instantiate")
        parser.link_arguments("data.vocab_size", "model.network.vocab_size", apply_on="instantiate")
        parser.link_arguments("model.network.attention", "data.max_length_caps", compute_fn=max_length_caps)
        parser.set_defaults({"trainer.callbacks": DEFAULT_CALLBACKS})

    def parse_arguments(self, parser, args):
        self.config = parser.parse_args(args)  # as CLI's (train.py hands the arguments over)
        self.named_class = named_on_command(self.config)
        ckpt_path = (self.config["fit"] if "fit" in self.config else self.config).get("ckpt_path")
        if ckpt_path and ckpt_path not in SPECIAL_NAMES:
            self.read(ckpt_path)

    def load_checkpoint(self, path: Path) -> dict:
        try:
            return read_pretraining_checkpoint(path)
        except CheckpointError:
            if not isinstance(load_safely(path).get("TextDataModule"), dict):
                raise
            raise CheckpointError(f"--ckpt_path {path}: a classifier checkpoint; `train.py pretrain --ckpt_path` "
                                  "resumes a pretraining run from its own checkpoint (give last, or a checkpoint "
                                  f"`train.py pretrain` wrote); to continue this classifier: train.py fit --ckpt_path "
                                  f"{path}") from None

    def before_fit(self):
        path = resolve(self.config["fit"].get("ckpt_path"), self.trainer)
        if path is None:
            return
        checkpoint = self.read(path)
        self.checkpoint = None
        check_pretraining_fits(path, checkpoint, self.model.network)
