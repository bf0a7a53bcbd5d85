"""The attention doctor on a trained checkpoint: the monitor's checks (monitor/health.py, monitor/checks.py) on a
validation sample of the run's data, its verdicts (monitor/doctor.py), the training history the monitor stored in
the checkpoint, and a one-page HTML report. diagnose.py is the command-line face.

    from inference.diagnosis import diagnose_checkpoint
    diagnosis = diagnose_checkpoint("lightning_logs/version_0")
    [finding.line() for finding in diagnosis.warnings]

The data are those the checkpoint recorded (its "datamodule_hyper_parameters": dataset, files, columns, validation
share and seed), each replaceable; the texts are encoded with the checkpoint's own tokenizer, cut to its max_length,
and padded by their lengths, as in training. No Lightning.
"""

import base64
import html
import io
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from data.sources import load_splits
from data.tokenizer import pad
from inference.classifier import TextClassifier
from inference.splits import SPLIT_KEYS
from inference.verdicts import monitor_history
from data.checkpoint import CheckpointError, open_checkpoint, read_checkpoint
from data.files import describe
from model.kind import asks_look_ahead
from model.threads import adapt
from monitor.checks import SAMPLE_TEXTS
from monitor.doctor import (NOT_LEARNING_TEXTS, Finding, figure_table_markdown, head_titles, not_learning,
                            verdict_table_markdown, warnings)
from monitor.health import AttentionHealth, HealthFigures
from monitor.units import Subject, examine
from monitor.views import stacked_layers

MAPS = 2  # validation texts drawn in the report


@dataclass
class Diagnosis:
    checkpoint: Path
    data: dict  # the data settings used
    texts: int  # validation texts read
    figures: HealthFigures
    findings: list[Finding]
    history: list[dict] = field(default_factory=list)  # the monitor's, from the checkpoint: {"step", "epoch", …}
    maps: list[tuple[list[str], list]] = field(default_factory=list)  # (tokens, one AttentionWeights per layer)
    notes: list[str] = field(default_factory=list)  # about the data read (data_changes)
    history_files: list[Path] = field(default_factory=list)  # where the history was read: it, and the run's last.ckpt

    @property
    def warnings(self) -> list[Finding]:
        """This check's warnings, and those of every validation the monitor recorded in training after its first
        optimizer step (training dynamics are only seen there, and a bug the weights learned to hide was named
        then): a warning at any epoch counts."""
        found = warnings(self.findings)
        seen = {(f.verdict, f.layer, f.head) for f in found}
        for entry in self.history:
            if entry.get("step", 1) == 0:  # a validation before any training step (a validate run)
                continue
            for finding in warnings(entry["findings"]):
                if (finding.verdict, finding.layer, finding.head) not in seen:
                    seen.add((finding.verdict, finding.layer, finding.head))
                    found.append(finding)
        return found

    @property
    def certified(self) -> list[int]:
        """The layers whose every stage matched their kind's definition recomputed here (computes-formula)."""
        return [f.layer for f in self.findings if f.verdict == "computes-formula"]


def data_settings(checkpoint: dict, overrides: dict) -> dict:
    """The data settings the checkpoint recorded, with `overrides` (None values ignored) on top; giving files or a
    dataset replaces the recorded source as a whole."""
    recorded = {key: value for key, value in (checkpoint.get("datamodule_hyper_parameters") or {}).items()
                if key in SPLIT_KEYS}
    given = {key: value for key, value in overrides.items() if value is not None}
    if {"dataset", "train_file", "data_dir"} & given.keys():
        recorded = {key: value for key, value in recorded.items() if key in ("val_fraction", "seed")}
    settings = {"dataset": None, "data_dir": None, "train_file": None, "val_file": None, "test_file": None,
                "text_column": None, "label_column": None, "val_fraction": 0.1, "seed": 0,
                "label_separator": None} | recorded | given
    if settings["dataset"] is None and settings["train_file"] is None:
        raise CheckpointError("it records no data settings (not written by train.py fit?): name its data with "
                              "--data.dataset NAME or --data.train_file FILE")
    return settings


def data_changes(checkpoint: dict, settings: dict) -> list[str]:
    """One note when a data file the run recorded at training ("data_files": path, size, modification time) and
    read again here is missing or differs now: the validation sample may not be the run's."""
    recorded = checkpoint.get("data_files")
    if not isinstance(recorded, list):
        return []
    folder = Path(settings["data_dir"]).resolve() if settings.get("data_dir") else None
    read = {str(Path(f).resolve()) for f in (settings.get(k) for k in ("train_file", "val_file", "test_file")) if f}
    changed = []
    for entry in recorded:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)):
            continue
        path = Path(entry[0])
        if str(path) not in read and (folder is None or path.parent != folder):
            continue  # not among the data read now (other data were given)
        try:
            stat = path.stat()
            now = [stat.st_size, int(stat.st_mtime)]
        except OSError:
            now = None
        if now != entry[1:]:
            changed.append(f"{path} ({'missing now' if now is None else f'{entry[1]} bytes then, {now[0]} now'})")
    if not changed:
        return []
    return [f"data file{'s' * (len(changed) > 1)} changed since training: {'; '.join(changed)}: the validation "
            "sample may differ from the run's"]


def validation_sample(settings: dict, label_names: list[str], texts: int, seed: int = 0):
    """(texts, label ids in the checkpoint's order) of a seeded random sample of the validation split."""
    splits = load_splits(**settings)
    known = {name: i for i, name in enumerate(label_names)}
    missing = sorted(set(splits.label_names) - known.keys())
    if missing:
        raise CheckpointError(f"the data have labels {missing} the checkpoint does not know ({label_names}): give "
                              "the data the run was trained on (--data.*)")
    pairs = list(zip(splits.texts["validation"], splits.labels["validation"]))
    chosen = sorted(random.Random(seed).sample(range(len(pairs)), min(texts, len(pairs))))
    if splits.multi_label:  # several labels a text: multi-hot rows in the checkpoint's label order
        return [pairs[i][0] for i in chosen], [[float(name in {splits.label_names[c] for c in pairs[i][1]})
                                                for name in label_names] for i in chosen]
    return [pairs[i][0] for i in chosen], [known[splits.label_names[pairs[i][1]]] for i in chosen]


def stored_history(checkpoint: dict) -> list[dict]:
    """The AttentionMonitor's history saved in the checkpoint (its state_dict), findings as Finding objects (a
    verdict this version does not know is a note); CheckpointError (one line) when it is not a history at all."""
    try:
        return [entry | {"step": int(entry["step"]), "epoch": int(entry["epoch"]),
                         "findings": [Finding.from_dict(f) for f in entry["findings"]],
                         "figures": {str(name): float(value) for name, value in (entry.get("figures") or {}).items()}}
                for entry in monitor_history(checkpoint)]
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"its AttentionMonitor history is not in a form this version reads ({describe(e)})"
                              ) from None


def run_history(path: Path, checkpoint: dict) -> tuple[list[dict], list[Path]]:
    """Every validation the run logged: the checkpoint's own history, joined by that of the run's last.ckpt beside
    it (saved after every epoch, so it holds the validations after a best checkpoint was saved), when it is of the
    same network. Returns (the entries by step, the files they were read from)."""
    def read(source: Path, stored: dict) -> list[dict]:
        try:
            return stored_history(stored)
        except CheckpointError as e:
            raise CheckpointError(f"{source}: {e}") from None

    history, sources = read(path, checkpoint), [path]
    last = path.parent / "last.ckpt"
    if last.is_file() and last.resolve() != path.resolve():
        later = read_checkpoint(last)
        network = (checkpoint.get("hyper_parameters") or {}).get("network")
        if (later.get("hyper_parameters") or {}).get("network") == network:  # else another run's file
            seen = {(entry["epoch"], entry["step"]) for entry in history}
            history += [entry for entry in read(last, later) if (entry["epoch"], entry["step"]) not in seen]
            sources.append(last)
    return sorted(history, key=lambda entry: (entry["step"], entry["epoch"])), sources


def own_not_learning(checkpoint: dict, history: list[dict], logits: list, labels: list, others) -> list[Finding]:
    """not-learning judged on the checkpoint itself: its balanced accuracy on the validation sample (one label a
    text) against a constant answer's 1 / classes, when it was saved at an epoch and step the rule judges and the
    sample holds NOT_LEARNING_TEXTS texts of two classes or more; the training loss of its step from the history."""
    if not logits or labels[0].ndim != 1:
        return []
    predicted, truth = torch.cat(logits).argmax(-1).cpu(), torch.cat(labels).cpu()
    if len(truth) < NOT_LEARNING_TEXTS:
        return []
    counts = torch.bincount(truth, minlength=int(truth.max()) + 1)
    hits = torch.bincount(truth[predicted == truth], minlength=len(counts))
    step, epoch = int(checkpoint.get("global_step", 0)), int(checkpoint.get("epoch", 0))
    training = next((entry["figures"] for entry in reversed(history) if entry["step"] <= step and entry["figures"]),
                    {})
    figures = {"train_loss": training.get("train_loss", math.nan), "prior_loss": training.get("prior_loss", math.nan),
               "balanced_accuracy": (hits / counts)[counts > 0].double().mean().item(),
               "classes_seen": int((counts > 0).sum()), "epoch": epoch, "step": step}
    found = not_learning(figures, others, f"this checkpoint (epoch {epoch}, step {step}) on {len(truth)} validation "
                                          "texts")
    return [found] if found else []


@torch.no_grad()
def diagnose_checkpoint(path, data: dict | None = None, texts: int = 1000, batch_size: int = 64, device="cpu",
                        progress=lambda batches: batches, before=lambda path, settings: None,
                        attention: str | None = None, allow_changed: bool = False) -> Diagnosis:
    """Every check of the attention doctor on a checkpoint (a run folder stands for its best checkpoint), with every
    validation the run logged (run_history) and not-learning judged on the checkpoint's own predictions.
    progress wraps the iterable of batches (a progress bar); before(checkpoint path, data settings) is called before
    any data is read (diagnose.py refuses its report's target there). attention, allow_changed: a network of a
    user's class, named as diagnose.py's --attention names it (TextClassifier.from_checkpoint)."""
    path, checkpoint = open_checkpoint(path)
    history, sources = run_history(path, checkpoint)
    classifier = TextClassifier.from_checkpoint(path, device=device, checkpoint=checkpoint, attention=attention,
                                                allow_changed=allow_changed,
                                                flags=("--attention", "--allow-changed-class"))
    model, config = classifier.model, classifier.model.config
    try:
        settings = data_settings(checkpoint, data or {})
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    before(path, settings)
    sample, labels = validation_sample(settings, classifier.label_names, texts)
    ids, tokens, _ = classifier.encode(sample)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # little padding, as the data module batches
    batches = []
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        input_ids, padding_mask = pad([ids[i] for i in chosen])
        device = classifier.device
        batches.append({"input_ids": input_ids.to(device), "padding_mask": padding_mask.to(device),
                        "labels": torch.tensor([labels[i] for i in chosen], device=classifier.device)})
    health = AttentionHealth(rows_per_batch=None, causal=asks_look_ahead(model))
    logits = []
    for batch in progress(batches):
        adapt()  # the pool's size to the cores other programs leave free (model/threads.py), once a second
        output = model(batch["input_ids"], batch["padding_mask"], need_weights=True)
        health.update(output.attention, batch["padding_mask"])
        logits.append(output.logits.float())
    figures = health.compute()
    # The model checks on a spread of the sample's batches (short and long texts alike), the contract on all.
    step = max(1, len(batches) * batch_size // SAMPLE_TEXTS)
    subject = Subject(model=model, sample=batches[::step], figures=figures, config=config, batches=batches,
                      measured={"optimizer": stored_optimizer_differences(checkpoint)})
    _, findings = examine(subject)  # every registered check (monitor/units.py), as the monitor runs them
    findings = own_not_learning(checkpoint, history, logits, [b["labels"] for b in batches], findings) + findings
    picks = [order[round(q * (len(order) - 1))] for q in (0.5, 0.75)][:MAPS]
    maps = []
    for i in dict.fromkeys(picks):
        output = model(torch.tensor([ids[i]], device=classifier.device), None, need_weights=True)
        maps.append((tokens[i], [layer for layer in output.attention]))
    return Diagnosis(path, settings, len(sample), figures, findings, history, maps,
                     notes=data_changes(checkpoint, settings), history_files=sources)


def stored_optimizer_differences(checkpoint: dict) -> list[dict]:
    """The optimizer's stored parameter groups against the stored model.lr and model.weight_decay, in the form of
    monitor.contract.optimizer_differences: a group whose initial learning rate is not model.lr, or whose weight
    decay is neither model.weight_decay nor 0 (the no-decay group of biases, LayerNorm gains and embeddings). The
    state names no parameter, so each is named by its group. Nothing when the checkpoint stores no optimizer."""
    hparams = checkpoint.get("hyper_parameters") or {}
    found = {}
    try:
        for state in checkpoint.get("optimizer_states") or []:
            for g, group in enumerate(state["param_groups"]):
                label = f"parameter group {g} ({len(group['params'])} parameters)"
                lr, decay = group.get("initial_lr", group.get("lr")), group.get("weight_decay")
                if "lr" in hparams and lr is not None and not close(lr, hparams["lr"]):
                    found.setdefault(("lr", float(lr), float(hparams["lr"])), []).append(label)
                wanted = hparams.get("weight_decay")
                if wanted is not None and decay is not None and not (close(decay, wanted) or decay == 0):
                    found.setdefault(("weight_decay", float(decay), float(wanted)), []).append(label)
    except (KeyError, TypeError, ValueError, AttributeError):  # not Lightning's form: nothing to compare
        return []
    return [{"setting": setting, "value": value, "configured": wanted, "parameters": names}
            for (setting, value, wanted), names in found.items()]


def close(a, b) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-12)


def text_report(diagnosis: Diagnosis) -> str:
    """The verdict table with causes and fixes, and the training history, for the console."""
    lines = [f"checkpoint {diagnosis.checkpoint}; {diagnosis.texts} validation texts of "
             f"{diagnosis.data.get('train_file') or diagnosis.data['dataset']}"]
    lines += [f"  NOTE    {note}" for note in diagnosis.notes]
    for finding in diagnosis.findings or []:
        lines.append(f"  {finding.severity.upper():7} {finding.line()}")
    if not diagnosis.findings:
        lines.append("  ok      every check passed")
    if diagnosis.history:
        lines.append("training history (the monitor's verdicts at each validation, read from "
                     f"{', '.join(map(str, diagnosis.history_files or [diagnosis.checkpoint]))}):")
        for entry in diagnosis.history:
            notes = sorted({f.verdict for f in entry["findings"] if f.severity == "note"})
            lines.append(f"  epoch {entry['epoch']:>3} step {entry['step']:>6}: warnings: {warned(entry) or 'none'}"
                         + (f"; notes: {', '.join(notes)}" if notes else ""))
    current = {(f.verdict, f.layer, f.head) for f in diagnosis.findings}
    for finding in diagnosis.warnings:
        if (finding.verdict, finding.layer, finding.head) not in current:  # given in training only
            epochs = [entry["epoch"] for entry in diagnosis.history if any(
                (f.verdict, f.layer, f.head) == (finding.verdict, finding.layer, finding.head)
                for f in entry["findings"])]
            lines.append(f"  WARNING {finding.line()} (in training, epoch {', '.join(map(str, epochs))})")
    for layer in diagnosis.certified:
        lines.append(f"  ok      attention layer {layer} computes the formula: every stage matches its kind's "
                     "definition recomputed from the layer's own input and weights")
    count = len(diagnosis.warnings)
    lines.append(f"{count} warning{'s' * (count != 1)}" + (": see above" if count else ": no bug class found"))
    return "\n".join(lines)


def markdown_table_html(markdown: str) -> str:
    """A markdown table of monitor/doctor.py (escaped cell by cell) as an HTML table."""
    rows = [line.strip("|").split(" | ") for line in markdown.splitlines() if not line.startswith("|:") and
            not line.startswith("|--")]
    if len(rows) < 2:
        return f"<p>{html.escape(markdown)}</p>"
    head = "".join(f"<th>{html.escape(cell.strip())}</th>" for cell in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell.strip())}</td>" for cell in row) + "</tr>"
                   for row in rows[1:])
    return f"<table><tr>{head}</tr>{body}</table>"


def map_images(diagnosis: Diagnosis) -> list[str]:
    """Each drawn text's heatmap (monitor/heatmap.py: every head on one 0–1 scale, tokens on the axes, a colour bar,
    each panel titled with its head's verdict) as a base64 PNG."""
    from monitor.heatmap import attention_figure  # matplotlib only for the report

    images = []
    for tokens, layers in diagnosis.maps:
        heads = [layer.weights.shape[1] for layer in layers]
        weights, positions, global_weights = stacked_layers(layers)  # one text: row 0 of the batch
        figure = attention_figure(weights[0], tokens, " ".join(tokens)[:70], 40, None, positions,
                                  None if global_weights is None else global_weights[0],
                                  head_titles(diagnosis.findings, heads))
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        images.append(base64.b64encode(buffer.getvalue()).decode())
    return images


def warned(entry: dict) -> str:
    """A history entry's warnings, "verdict (where)", comma-separated."""
    return ", ".join(f"{f.verdict} ({f.where()})" for f in entry["findings"] if f.severity == "warning")


def html_report(diagnosis: Diagnosis) -> str:
    """One self-contained page: the verdicts with causes and fixes, the figures, the training history, the maps."""
    count = len(diagnosis.warnings)
    history = "".join(
        f"<tr><td>{entry['epoch']}</td><td>{entry['step']}</td><td>{html.escape(warned(entry) or 'none')}</td>"
        f"<td>{html.escape(', '.join(sorted({f.verdict for f in entry['findings'] if f.severity == 'note'})))}</td></tr>"
        for entry in diagnosis.history)
    maps = "".join(f'<img alt="attention of a validation text" src="data:image/png;base64,{image}">'
                   for image in map_images(diagnosis))
    summary = f"{count} warning{'s' * (count != 1)}" if count else "no warning: no bug class found"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>attention diagnosis</title><style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }} table {{ border-collapse: collapse;
font-size: .85em; margin: .5em 0 1.5em; }} td, th {{ border: 1px solid #ccc; padding: .2em .5em; text-align: left;
vertical-align: top; }} img {{ max-width: 100%; display: block; margin: 1em 0; }} .bad {{ color: #b00; }}
</style></head><body>
<h1>Attention diagnosis</h1>
<p>{html.escape(str(diagnosis.checkpoint))}: {diagnosis.texts} validation texts of
{html.escape(str(diagnosis.data.get('train_file') or diagnosis.data['dataset']))}.
<b class="{'bad' if count else ''}">{summary}</b>. The verdicts and their rules: docs/DOCTOR.md.</p>
{''.join(f'<p>attention layer {layer} computes the formula: every stage matches its kind&#39;s definition '
         f'recomputed from the layer&#39;s own input and weights.</p>' for layer in diagnosis.certified)}
<h2>Verdicts</h2>{markdown_table_html(verdict_table_markdown(diagnosis.findings))}
{'<h2>Warnings given in training only</h2>' + markdown_table_html(verdict_table_markdown(
    [f for f in diagnosis.warnings if f not in diagnosis.findings])) if any(
    f not in diagnosis.findings for f in diagnosis.warnings) else ''}
<h2>Attention of two validation texts</h2>
<p>Every head on one 0–1 colour scale (query rows, key columns), each titled with its verdict.</p>{maps}
<h2>Figures per head</h2>{markdown_table_html(figure_table_markdown(diagnosis.figures))}
<h2>Training history</h2>
{'<table><tr><th>epoch</th><th>step</th><th>warnings</th><th>notes</th></tr>' + history + '</table>'
 if history else '<p>The checkpoint holds no monitor history (trained without the AttentionMonitor).</p>'}
</body></html>
"""
