"""Where a training step's time goes against what this machine can do, and what other programs cost it.

    python -m bench.roofline                   # configs/sst2.yaml: 400 steps quiet, 400 beside 1 and 2 busy programs
    python -m bench.roofline --quick           # about a minute on 2 CPU cores
    python -m bench.roofline --smoke           # seconds, configs/smoke.yaml: does it run?
    python -m bench.timing roofline --quick    # the same through the timing harness

On the machine it runs on it measures the matrix-product rate (GFLOPS at the config's shapes: the projections and
the feed-forward of a batch of its training texts) and the memory bandwidth (a large copy). Then one training run of
the config through train.py (its data, its callbacks: the attention monitor on; no validation) runs in phases:
warm-up, quiet, then beside one and beside two busy programs (plain Python loops this bench starts and always
stops, Ctrl-C included; they also stop themselves when this process dies). Each phase prints seconds per step
against quiet; the quiet phase prints each step's time split into

    data          fetching and collating the next batch (and Lightning's loop between two steps)
    forward       the network's forward pass
    logging       the loss, its checks and the per-step metrics and self.log calls; the logger's writes
    backward      loss.backward()
    optimizer     the AdamW step
    monitor       the attention monitor's per-step hooks
    rest          everything else (the learning-rate schedule, other callbacks, Lightning's bookkeeping)

each against its floor: FLOPs (counted on the run's own batches) ÷ the matrix-product rate for forward and backward,
bytes ÷ bandwidth for the optimizer (AdamW reads weight, gradient and two moments and writes three of them) and the
data (the batch itself); nothing has to be computed for the rest. Training tokens/s count real (not padding) tokens;
inference tokens/s time the trained network over the validation split in evaluation mode. The estimate of a whole
`make train` adds set-up, validation passes and the config's epochs to the measured step time.

The thread pool is the commands' own (runtime.py): to compare another setting, run the bench again under it,
e.g. `GOMP_SPINCOUNT=300000 python -m bench.roofline --quick` (libgomp's long spin, torch's default),
`OMP_WAIT_POLICY=PASSIVE …` (threads sleep at once) or
`OMP_NUM_THREADS=1 …`. The tables go to stderr; the last line of stdout is one JSON object of every figure.
"""

import json
import logging
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback
from torch.utils.flop_counter import FlopCounterMode

from bench.common import CONFIGS, ROOT, read_config
from bench.machine import bandwidth_gbs, busy_programs, matmul_gflops, median_seconds, sigterm_as_interrupt
import runtime

log = logging.getLogger("bench.roofline")

CONFIG = CONFIGS / "sst2.yaml"
PARTS = ("data", "forward", "logging", "backward", "optimizer", "monitor", "rest")
PHASES = ("warm-up", "quiet", "1 busy", "2 busy")
BUSY_PROGRAMS = {"quiet": 0, "1 busy": 1, "2 busy": 2}
FLOP_BATCHES = 8  # training batches whose FLOPs are counted (the mean is the floor's)


def add_arguments(parser) -> None:
    parser.add_argument("--config", type=Path, default=CONFIG, help="the training config (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=400, help="training steps per phase (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=20, help="steps before the quiet phase (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="100 steps a phase, 10 warm-up: about a minute")
    parser.add_argument("--smoke", action="store_true", help="configs/smoke.yaml, 6 steps a phase: does it run?")
    parser.add_argument("--no-busy", action="store_true", help="the quiet phase only")


# ---- the training run -------------------------------------------------------------------------------------------


class StepClock(Callback):
    """Splits each training step's wall time into PARTS (see the module's docstring) and runs the phases: after
    `warmup` steps, `steps` quiet ones, then `steps` beside each number of busy programs.

    Time is read at hook boundaries; what the monitor and the logger spend inside a boundary is taken out of it
    and counted as their own."""

    def __init__(self, warmup: int = 20, steps: int = 400, busy: bool = True):
        self.warmup, self.steps, self.busy = warmup, steps, busy
        self.phases = [("warm-up", warmup), ("quiet", steps)] + ([("1 busy", steps), ("2 busy", steps)] if busy else [])
        self.records = {name: [] for name, _ in self.phases}  # per step: {part: seconds}
        self.tokens = {name: 0 for name, _ in self.phases}
        self.inside = {}  # seconds spent in wrapped hooks since the last mark, by part
        self.last, self.current, self.phase_index, self.step_in_phase = None, None, 0, 0
        self.busy_context, self.figures = None, {}

    # what the monitor and the logger do is timed from inside their own methods
    def wrap(self, owner, name: str, part: str) -> None:
        method = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.inside[part] = self.inside.get(part, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)

    def mark(self, part: str) -> None:
        now = time.perf_counter()
        if self.current is not None and self.last is not None:
            inside = sum(self.inside.values())
            self.current[part] = self.current.get(part, 0.0) + (now - self.last) - inside
            for name, seconds in self.inside.items():
                self.current[name] = self.current.get(name, 0.0) + seconds
        self.inside, self.last = {}, now

    def on_train_start(self, trainer, pl_module):
        from monitor import AttentionMonitor

        self.train_started = time.perf_counter()

        for callback in trainer.callbacks:
            if isinstance(callback, AttentionMonitor):
                for hook in ("on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
                             "on_before_optimizer_step", "on_before_zero_grad"):
                    self.wrap(callback, hook, "monitor")
        for logger in trainer.loggers:
            self.wrap(logger, "log_metrics", "logging")
        network = pl_module.online_model
        network.register_forward_pre_hook(lambda *_: self.mark("rest"))
        network.register_forward_hook(lambda *_: self.mark("forward"))
        # Lightning runs the closure (forward, backward) inside optimizer.step(): its post-hook closes the update.
        for optimizer in trainer.optimizers:
            optimizer.register_step_post_hook(lambda *_: self.mark("optimizer"))
        self.wrap(trainer, "save_checkpoint", "rest")  # an epoch's end within a phase
        self.measure_machine(trainer, pl_module)
        self.last = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.current = {}
        self.mark("data")

    def on_before_backward(self, trainer, pl_module, loss):
        self.mark("logging")

    def on_after_backward(self, trainer, pl_module):
        self.mark("backward")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.mark("rest")
        name, steps = self.phases[self.phase_index]
        self.records[name].append(self.current)
        self.tokens[name] += int((~batch["padding_mask"]).sum())
        self.current, self.step_in_phase = None, self.step_in_phase + 1
        if self.step_in_phase == steps:
            self.next_phase()
        self.last = time.perf_counter()  # starting or stopping busy programs is no part of any step

    def next_phase(self) -> None:
        self.stop_busy_programs()
        self.phase_index, self.step_in_phase = self.phase_index + 1, 0
        if self.phase_index < len(self.phases):
            count = BUSY_PROGRAMS.get(self.phases[self.phase_index][0], 0)
            if count:
                self.busy_context = busy_programs(count)
                self.busy_context.__enter__()
                time.sleep(0.2)  # let them start before the phase's first step

    def stop_busy_programs(self) -> None:
        if self.busy_context is not None:
            self.busy_context.__exit__(None, None, None)
            self.busy_context = None

    def on_exception(self, trainer, pl_module, exception):  # Ctrl-C or an error: Lightning's own handling first
        self.stop_busy_programs()

    def teardown(self, trainer, pl_module, stage):
        self.stop_busy_programs()

    def on_train_end(self, trainer, pl_module):
        self.figures["inference_tokens_per_s"] = inference_tokens_per_s(pl_module.model, trainer.datamodule)

    # ---- floors --------------------------------------------------------------------------------------------------

    def measure_machine(self, trainer, pl_module) -> None:
        """The matrix-product rate at the config's shapes, the bandwidth, and each part's floor per step."""
        network = pl_module.online_model
        config = network.config
        batches = list(zip(range(FLOP_BATCHES), trainer.datamodule.train_dataloader()))
        tokens = statistics.mean(int((~batch["padding_mask"]).sum()) for _, batch in batches)
        shapes = [(round(tokens), config.d_model, 3 * config.n_heads * config.head_size),
                  (round(tokens), config.n_heads * config.head_size, config.d_model)]
        if config.d_ff > 0:
            shapes += [(round(tokens), config.d_model, config.d_ff), (round(tokens), config.d_ff, config.d_model)]
        gflops, bandwidth = matmul_gflops(shapes), bandwidth_gbs()
        forward, backward = step_flops(network, [batch for _, batch in batches])
        weights = sum(p.numel() for p in network.parameters() if p.requires_grad)
        batch_bytes = statistics.mean(sum(t.numel() * t.element_size() for t in batch.values()
                                          if isinstance(t, torch.Tensor)) for _, batch in batches)
        self.figures |= {
            "matmul_gflops": round(gflops, 1), "matmul_shapes": shapes, "bandwidth_gb_per_s": round(bandwidth, 1),
            "forward_gflop_per_step": round(forward / 1e9, 3), "backward_gflop_per_step": round(backward / 1e9, 3),
            "trained_weights": weights, "mean_real_tokens_per_batch": round(tokens, 1),
        }
        self.floors = {"data": batch_bytes / bandwidth / 1e9, "forward": forward / gflops / 1e9,
                       "backward": backward / gflops / 1e9, "optimizer": 7 * 4 * weights / bandwidth / 1e9,
                       "logging": 0.0, "monitor": 0.0, "rest": 0.0}

    # ---- results ---------------------------------------------------------------------------------------------------

    def summary(self) -> tuple[str, dict]:
        lines, figures = [], dict(self.figures)
        quiet = self.records["quiet"]
        per_step = {part: statistics.mean(r.get(part, 0.0) for r in quiet) for part in PARTS}
        step = sum(per_step.values())
        floor = sum(self.floors.values())
        lines.append(f"matrix products {figures['matmul_gflops']:.0f} GFLOPS at {figures['matmul_shapes']} "
                     f"(tokens, in, out); memory {figures['bandwidth_gb_per_s']:.1f} GB/s; "
                     f"{runtime.configure().describe()}")
        lines.append(f"\nquiet training step (mean of {len(quiet)}): {1000 * step:.1f} ms, floor {1000 * floor:.2f} ms "
                     f"({step / floor:.1f}× the floor)")
        lines.append(f"{'part':<10} {'ms/step':>8} {'share':>6} {'floor ms':>9} {'× floor':>8}")
        for part in PARTS:
            seconds, least = per_step[part], self.floors[part]
            times = f"{seconds / least:8.1f}" if least > 0 else f"{'—':>8}"
            lines.append(f"{part:<10} {1000 * seconds:8.2f} {100 * seconds / step:5.1f}% {1000 * least:9.3f} {times}")
        figures["quiet_ms_per_step"] = {part: round(1000 * s, 3) for part, s in per_step.items()}
        figures["floor_ms_per_step"] = {part: round(1000 * s, 4) for part, s in self.floors.items()}
        figures["step_ms"], figures["floor_ms"] = round(1000 * step, 2), round(1000 * floor, 3)
        figures["training_tokens_per_s"] = round(self.tokens["quiet"] / sum(sum(r.values()) for r in quiet))
        lines.append(f"\ntraining {figures['training_tokens_per_s']:,} real tokens/s (quiet); inference "
                     f"{figures['inference_tokens_per_s']:,} tokens/s (validation split, evaluation mode)")
        lines.append(f"\n{'beside it':<18} {'ms/step':>8} {'× quiet':>8}   slowest part grown")
        figures["phases"] = {}
        for name in ("quiet", "1 busy", "2 busy"):
            records = self.records.get(name)
            if not records:
                continue
            ms = 1000 * statistics.mean(sum(r.values()) for r in records)
            grown = {part: statistics.mean(r.get(part, 0.0) for r in records) - per_step[part] for part in PARTS}
            worst = max(grown, key=grown.get)
            label = {"quiet": "nothing", "1 busy": "1 busy program", "2 busy": "2 busy programs"}[name]
            lines.append(f"{label:<18} {ms:8.1f} {ms / (1000 * step):7.2f}×   "
                         + ("" if name == "quiet" else f"{worst} +{1000 * grown[worst]:.1f} ms"))
            parts = {p: round(1000 * statistics.mean(r.get(p, 0.0) for r in records), 3) for p in PARTS}
            figures["phases"][name] = {"ms_per_step": round(ms, 2), "x_quiet": round(ms / (1000 * step), 3),
                                       "ms_per_part": parts}
        return "\n".join(lines), figures


def step_flops(network, batches) -> tuple[float, float]:
    """Mean FLOPs of one training step's forward and backward pass over these batches (counted by torch)."""
    forward, backward = [], []
    for batch in batches:
        with FlopCounterMode(display=False) as counter:
            logits = network(batch["input_ids"], batch["padding_mask"]).logits
        forward.append(counter.get_total_flops())
        with FlopCounterMode(display=False) as counter:
            F.cross_entropy(logits, batch["labels"]).backward()
        backward.append(counter.get_total_flops())
    network.zero_grad(set_to_none=True)
    return statistics.mean(forward), statistics.mean(backward)


@torch.inference_mode()
def inference_tokens_per_s(network, datamodule, repeats: int = 3) -> int:
    """Real tokens per second of the network in evaluation mode over the validation split (median of passes)."""
    batches = list(datamodule.val_dataloader())
    tokens = sum(int((~b["padding_mask"]).sum()) for b in batches)
    was_training = network.training
    network.eval()
    try:
        seconds = median_seconds(lambda: [network(b["input_ids"], b["padding_mask"]) for b in batches],
                                 repeats=repeats, least=0.0)
    finally:
        network.train(was_training)
    return round(tokens / seconds)


def config_callbacks(config: Path) -> list:
    """The config's own trainer.callbacks (train.py's default ones when it lists none)."""
    from training.commands import DEFAULT_CALLBACKS

    callbacks = (read_config(config).get("trainer") or {}).get("callbacks")
    return list(callbacks) if callbacks else list(DEFAULT_CALLBACKS)


def make_train_estimate(config: Path, cli, figures: dict, set_up: float) -> dict:
    """Seconds a whole `train.py fit --config CONFIG` would take here: set-up + epochs × (steps × the measured step
    time + a validation pass at the measured inference rate), quiet and beside one busy program."""
    data = cli.datamodule
    epochs = (read_config(config).get("trainer") or {}).get("max_epochs")
    if not epochs:
        return {}
    steps = math.ceil(len(data.split("train")) / data.hparams.batch_size)
    validation_tokens = sum(data.split("validation").lengths)
    validation = validation_tokens / figures["inference_tokens_per_s"]
    estimate = {}
    for name in ("quiet", "1 busy", "2 busy"):
        phase = figures["phases"].get(name)
        if phase:
            estimate[name] = round(set_up + epochs * (steps * phase["ms_per_step"] / 1000 + validation))
    return {"epochs": epochs, "steps_per_epoch": steps, "set_up_s": round(set_up, 1), "seconds": estimate}


def run(args) -> tuple[str, dict]:
    if args.quick:
        args.steps, args.warmup = 100, 10
    if args.smoke:
        args.config, args.steps, args.warmup = CONFIGS / "smoke.yaml", 6, 2
    os.environ.setdefault("ATTENTION_DATA_ROOT", str(ROOT.parent / "shared" / "data"))
    import train

    clock_path = f"{__name__}.StepClock"
    callbacks = config_callbacks(args.config) + [{"class_path": clock_path, "init_args": {
        "warmup": args.warmup, "steps": args.steps, "busy": not args.no_busy}}]
    previous = signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    command_line, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI reads the list below, not this bench's options
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="roofline-") as folder:
            total = args.warmup + args.steps * (1 if args.no_busy else 3)
            cli = train.main([
                "fit", "--config", str(args.config), "--trainer.max_steps", str(total), "--trainer.max_epochs", "-1",
                "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0",
                "--trainer.callbacks", json.dumps(callbacks), "--trainer.enable_progress_bar", "false",
                "--trainer.enable_model_summary", "false", "--trainer.default_root_dir", folder,
            ])
            clock = next(c for c in cli.trainer.callbacks if type(c).__name__ == "StepClock")
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.argv = command_line
    wall = time.perf_counter() - start
    table, figures = clock.summary()
    estimate = make_train_estimate(args.config, cli, figures, set_up=clock.train_started - start)
    if estimate:
        seconds = estimate["seconds"]
        table += (f"\n\nestimated `train.py fit --config {args.config}` ({estimate['epochs']} epochs × "
                  f"{estimate['steps_per_epoch']} steps, set-up {estimate['set_up_s']} s here): "
                  + ", ".join(f"{s} s {'quiet' if name == 'quiet' else 'beside ' + name}"
                              for name, s in seconds.items()))
    setting = runtime.configure()  # bench/__init__.py's, already made
    figures |= {"config": str(args.config), "steps_per_phase": args.steps, "wall_s": round(wall, 1),
                "threads": setting.threads, "wait_policy": setting.wait_policy, "thread_source": setting.source,
                "make_train_estimate": estimate}
    return table, figures


def main(argv=None) -> int:
    from bench import timing

    return 1 if timing.main(["roofline", *(sys.argv[1:] if argv is None else argv)]).get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
