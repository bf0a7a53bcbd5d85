"""The attention doctor: verdicts that name a cause and a fix, each backed by the figures that led to it.

`VERDICTS` (monitor/verdict_table.py) is the one table (verdict → severity, rule, likely cause, what to try), with
the thresholds its rules name. `diagnose()`, the built-in "verdicts" check, turns one
validation pass's figures (monitor/health.py: what the layers computed, against the batch's own lengths), the
model checks on a validation sample (monitor/checks.py: heads zeroed one at a time, tokens shuffled, the weights'
own head slices) and the training dynamics (loss, update/weight ratio per optimizer step) into Findings.

A warning is a bug class: something the figures show a working layer cannot do (weight on padding, rows that do
not sum to one, every head's scores far below any initialised layer's). A note is information: a head that
averages on purpose, a head the loss does not need, a model still learning. Entropy alone never makes a warning:
healthy models sit at entropy 0.95-0.98 after their first epochs.
"""

import math

from monitor.health import HealthFigures
from monitor.thresholds import INVARIANCE, SCALE_FACTOR
# Verdict, VERDICTS, Finding and NOT_LEARNING_TEXTS are also read from here (monitor/units.py, inference/).
from monitor.verdict_table import (AVERAGING_ENTROPY, CHANCE_MARGIN, FUTURE_WEIGHT, FUTURE_ZERO_SHARE, NEEDED_LOSS,
                                   NOT_LEARNING_EPOCH, NOT_LEARNING_STEPS, NOT_LEARNING_TEXTS, ORDER_SENSITIVITY,
                                   PAD_WEIGHT, PRIOR_LOSS, REAL_ZERO_SHARE, ROW_SUM_ERROR, SAME_SCORES, SAME_WEIGHTS,
                                   SATURATED_GRADIENT_PASS, SATURATED_SCORE_STD, SMALL_SCORE_STD, STILL_LEARNING,
                                   UNKNOWN, UNSTEADY, UNUSED_LOSS, UPDATE_RATIO, VERDICTS, Finding, Verdict,
                                   format_figure)


def diagnose(figures: HealthFigures | None, checks: dict | None = None, dynamics: dict | None = None,
             config=None) -> list[Finding]:
    """The findings of one validation pass, warnings first. figures: monitor/health.py's; checks: monitor/checks.py's
    model_checks (None: not run); dynamics: {"update_ratio", "nonfinite_loss", "loss_drop"} from the training batches
    (None: no training since the last pass); config: the NetworkConfig (positions, kind, causal)."""
    findings = model_findings(checks or {}, dynamics or {}, config) + contract_findings(checks or {}, dynamics or {},
                                                                                       config)
    if figures is None or figures.rows == 0:
        stuck = not_learning(dynamics or {}, findings)
        return findings + [stuck] * bool(stuck) + [Finding("no-data", None, None, {})]
    if not all(math.isfinite(v) for layer in range(len(figures.entropy))
               for v in figures.row_sum_error[layer, : figures.heads_of(layer)].tolist()):
        findings.append(Finding("something-wrong", None, None, {"row_sum_error": math.nan}))
    bug_layers = set()
    for layer in range(len(figures.entropy)):
        layer_findings = layer_warnings(figures, layer, checks or {})
        bug_layers |= {layer} if layer_findings else set()
        findings += layer_findings
    findings += head_notes(figures, checks or {}, bug_layers)
    stuck = not_learning(dynamics or {}, findings)
    findings += [stuck] if stuck else []
    return sorted(findings, key=lambda f: f.severity != "warning")


def model_findings(checks: dict, dynamics: dict, config) -> list[Finding]:
    findings = []
    ratio = dynamics.get("update_ratio", math.nan)
    if dynamics.get("nonfinite_loss") or ratio >= UPDATE_RATIO:
        findings.append(Finding("unstable-training", None, None,
                                {"update_ratio": ratio, "nonfinite_loss": float(dynamics.get("nonfinite_loss", 0))}))
    order, position = checks.get("order_sensitivity", math.nan), checks.get("position_sensitivity", math.nan)
    if (order < ORDER_SENSITIVITY or position < ORDER_SENSITIVITY) and config is not None \
            and config.positions != "none":
        findings.append(Finding("positions-unused", None, None,
                                {"order_sensitivity": order, "position_sensitivity": position}))
    unsteady = checks.get("unsteady_loss", math.nan)
    if unsteady >= UNSTEADY:
        findings.append(Finding("something-wrong", None, None, {"unsteady_loss": unsteady}))
    if dynamics.get("loss_drop", 0.0) > STILL_LEARNING:
        findings.append(Finding("still-learning", None, None, {"loss_drop": dynamics["loss_drop"]}))
    return findings


def contract_findings(checks: dict, dynamics: dict, config) -> list[Finding]:
    """The contract (monitor/contract.py, monitor/dynamics.py): the formula per layer, each block around it, weights
    that are their own, the settings, the optimizer, every parameter learning, the invariances, and a model that
    does not learn."""
    found = []
    for layer, result in enumerate(checks.get("formula", [])):
        if result.get("skipped"):
            found.append(Finding("user-class", layer, None, {}, result["skipped"]))
        elif result["stage"] is None:
            found.append(Finding("computes-formula", layer, None, {"difference": result["largest"]}))
        else:
            found.append(Finding("formula-broken", layer, None, {"difference": result["difference"]},
                                 f"first differing stage: {result['stage']}, {result['how']}"))
    for block, result in enumerate(checks.get("blocks", [])):
        if result["stage"] is not None:
            found.append(Finding("block-broken", block, None, {"difference": result["difference"]},
                                 f"first differing step: {result['stage']}, {result['how']}"))
    for first, second, how in checks.get("shared", []):
        found.append(Finding("shared-weight", None, None, {}, f"{first} and {second} are {how}"))
    for entry in checks.get("optimizer", []):
        names = entry["parameters"]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        found.append(Finding("optimizer-setting", None, None,
                             {entry["setting"]: entry["value"], "configured": entry["configured"]},
                             f"{entry['setting']} {entry['value']:g} in the optimizer, configured "
                             f"model.{entry['setting']} {entry['configured']:g}, for {shown}"))
    factor = checks.get("scale_factor", math.nan)
    if factor >= SCALE_FACTOR or factor <= 1 / SCALE_FACTOR:
        found.append(Finding("formula-setting", None, None, {"scale_factor": factor, "scale": checks["scale"]},
                             f"--model.network.scale {checks['scale']:g} is {factor:.3g} × 1/√d_k"))
    loss = dynamics.get("loss") or {}
    if loss:
        found.append(Finding("loss-broken", None, None, {"loss_difference": loss["difference"],
                                                          "loss_used": loss["used"], "loss_defined": loss["expected"]},
                             loss["how"]))
    for name, reason in dynamics.get("parameters", {}).items():
        found.append(Finding("weight-not-learning", None, None, {}, f"{name}: {reason}"))
    for name, delta in checks.get("invariance", {}).items():
        if delta >= INVARIANCE:
            found.append(Finding("invariance-broken", None, None, {f"{name}_change": delta},
                                 {"padding": "padding the batch further changes predictions",
                                  "neighbours": "a text alone is predicted otherwise than with its batch"}.get(name,
                                                                                                              name)))
    return found


def not_learning(figures: dict, others: list[Finding], where: str = "") -> Finding | None:
    """The not-learning rule on one validation's figures ({"epoch", "step", "train_loss", "prior_loss",
    "balanced_accuracy", "classes_seen"}; a missing one is not judged), its cause read from them and from the other
    warnings of the same pass (`others`). where: how the figures were taken, said in the finding's detail."""
    if not (figures.get("epoch", -1) >= NOT_LEARNING_EPOCH and figures.get("step", math.inf) >= NOT_LEARNING_STEPS):
        return None
    loss, prior = figures.get("train_loss", math.nan), figures.get("prior_loss", math.nan)
    balanced, classes = figures.get("balanced_accuracy", math.nan), figures.get("classes_seen", 0)
    # Balanced, not plain accuracy: a validation sample that is mostly one class (a pass cut short on a file
    # sorted by label, or imbalanced data) puts a learning model's accuracy near the majority rate. Texts of one
    # class only say nothing about telling classes apart.
    flat = loss >= PRIOR_LOSS * prior
    at_chance = classes >= 2 and balanced <= 1 / classes + CHANCE_MARGIN
    if not (flat or at_chance):
        return None
    contract = list(dict.fromkeys(f.verdict for f in warnings(others) if f.verdict != "not-learning"))
    if contract:
        cause = f"the cause is what {', '.join(contract)} say{'s' * (len(contract) == 1)}"
    elif at_chance and loss < PRIOR_LOSS * prior:
        cause = ("the training loss fell below guessing the prior while validation stays at or below chance: the "
                 "model validated is not the one trained, or the splits' labels disagree")
    elif flat:
        cause = ("the training loss stays at guessing the prior" + (" and validation at chance" if at_chance else "")
                 + ": the learning rate, the schedule or the optimizer (or training labels out of step with the "
                 "texts)")
    else:  # at chance, and no training loss to read (a checkpoint without the monitor's history)
        cause = ("validation at chance, no training loss recorded to tell the model validated from the one trained: "
                 "check the learning rate, the schedule, the optimizer and both splits' labels")
    numbers = {"train_loss": loss, "prior_loss": prior, "balanced_accuracy": balanced, "classes_seen": classes}
    return Finding("not-learning", None, None, {name: float(value) for name, value in numbers.items()},
                   f"{where}{'; ' * bool(where)}{cause}")


def layer_warnings(figures: HealthFigures, layer: int, checks: dict) -> list[Finding]:
    """Bug classes that strike a whole layer: its mask, its softmax, its scale, its heads' starting weights."""
    heads = figures.heads_of(layer)

    def most(name):  # the largest value of a figure over the layer's heads (NaN when the kind has none)
        values = [v for v in getattr(figures, name)[layer, :heads].tolist() if not math.isnan(v)]
        return max(values) if values else math.nan

    found = []
    pad, real_zero, row_sum = most("pad_weight"), most("real_zero_share"), most("row_sum_error")
    if real_zero >= REAL_ZERO_SHARE and pad >= PAD_WEIGHT:
        # Every other figure of the layer is read over keys it should never have seen: this one cause is enough.
        return [Finding("mask-inverted", layer, None, {"real_zero_share": real_zero, "pad_weight": pad})]
    if row_sum >= ROW_SUM_ERROR:  # the weights are no softmax over the keys: what else they show means nothing
        return [Finding("rows-not-normalized", layer, None, {"row_sum_error": row_sum, "pad_weight": pad})]
    if pad >= PAD_WEIGHT:
        found.append(Finding("padding-leak", layer, None, {"pad_weight": pad, "padded_rows": figures.padded_rows}))
    future_zero, future = most("future_zero_share"), most("future_weight")
    if future_zero >= FUTURE_ZERO_SHARE:
        found.append(Finding("unasked-look-ahead", layer, None, {"future_zero_share": future_zero}))
    if future >= FUTURE_WEIGHT:
        found.append(Finding("something-wrong", layer, None, {"future_weight": future}))
    score_std, gradient_pass = most("score_std"), most("gradient_pass")
    if score_std < SMALL_SCORE_STD:
        found.append(Finding("scale-too-small", layer, None, {"score_std": score_std, "entropy": most("entropy")}))
    smallest_std = -most_negative(figures.score_std[layer, :heads])
    if gradient_pass < SATURATED_GRADIENT_PASS and smallest_std >= SATURATED_SCORE_STD:
        found.append(Finding("saturated", layer, None, {"gradient_pass": gradient_pass, "score_std": smallest_std}))
    if heads > 1:
        correlation = figures.score_correlation[layer, :heads, :heads].clone()
        correlation.fill_diagonal_(-math.inf)
        best = int(correlation.nan_to_num(-math.inf).flatten().argmax())
        a, b = divmod(best, heads)
        value = float(correlation[a, b])
        weights = checks.get("weight_similarity")
        same_weights = math.nan if weights is None else weights[layer][a][b]
        # Scores alike AND weights alike (when the checks ran): heads that merely collapse onto the same keys
        # (a learning rate far too high) score alike from independent weights.
        if value >= SAME_SCORES and not same_weights < SAME_WEIGHTS:
            similarity = float(figures.head_similarity[layer, a, b])
            found.append(Finding("identical-heads", layer, None,
                                 {"score_correlation": value, "weight_similarity": same_weights,
                                  "head_similarity": similarity, "head_a": a, "head_b": b}))
    return found


def most_negative(values) -> float:
    """−min of a tensor's finite values (NaN when none): the smallest value, for `≥` rules over every head."""
    finite = [v for v in values.tolist() if not math.isnan(v)]
    return -min(finite) if finite else math.nan


def head_notes(figures: HealthFigures, checks: dict, bug_layers: set[int]) -> list[Finding]:
    """Notes on single heads of layers without a warning: averaging on purpose, or not used by the loss."""
    notes = []
    delta = checks.get("head_loss_delta")  # (n_layers, H) or None
    for layer in range(len(figures.entropy)):
        if layer in bug_layers:
            continue
        for head in range(figures.heads_of(layer)):
            entropy = float(figures.entropy[layer, head])
            loss_delta = math.nan if delta is None else float(delta[layer][head])
            if entropy >= AVERAGING_ENTROPY:
                use = {} if math.isnan(loss_delta) else {"needed": float(loss_delta >= NEEDED_LOSS)}
                notes.append(Finding("averaging-head", layer, head,
                                     {"entropy": entropy, "head_loss_delta": loss_delta} | use))
            elif abs(loss_delta) < UNUSED_LOSS:
                notes.append(Finding("unused-head", layer, head, {"head_loss_delta": loss_delta, "entropy": entropy}))
    return notes


def warnings(findings: list[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.severity == "warning"]


def head_titles(findings: list[Finding], heads: list[int]) -> list[list[str]]:
    """The verdict of each (layer, head) for a panel title: its own or its layer's or the model's warnings, else
    its note, else "ok". heads: the heads of each layer."""
    titles = []
    for layer, n in enumerate(heads):
        row = []
        for head in range(n):
            mine = [f for f in findings if f.layer in (None, layer) and f.head in (None, head)
                    and (f.head is not None or f.severity == "warning")]
            names = [f.verdict for f in mine if f.severity == "warning"] or [f.verdict for f in mine] or ["ok"]
            row.append(", ".join(dict.fromkeys(names)))
        titles.append(row)
    return titles


def verdict_table_markdown(findings: list[Finding]) -> str:
    """A markdown table, one row per finding (warnings first), for TensorBoard's text tab and the report."""
    if not findings:
        return "no findings: every check passed"
    lines = ["| where | verdict | severity | figures | likely cause | what to try |", "|:---|:---|:---|:---|:---|:---|"]
    for finding in findings:
        verdict = VERDICTS.get(finding.verdict, UNKNOWN)
        numbers = ", ".join(f"{name} {format_figure(value)}" for name, value in finding.figures.items())
        numbers += f"; {finding.detail}" if numbers and finding.detail else finding.detail
        lines.append(f"| {finding.where()} | {finding.verdict} | {finding.severity} | {numbers} | {verdict.cause} "
                     f"| {verdict.fix} |")
    return "\n".join(lines)


# The per-head figures shown beside the verdicts (their table) and logged as scalars (monitor/callback.py).
SHOWN_FIGURES = ("entropy", "max_weight", "score_std", "gradient_pass", "distance", "pad_weight", "row_sum_error")


def figure_table_markdown(figures: HealthFigures) -> str:
    """The per-head figures as a markdown table: what the verdicts were read from."""
    names = SHOWN_FIGURES
    lines = ["| layer | head | " + " | ".join(names) + " |", "|---:|---:|" + "---:|" * len(names)]
    for layer in range(len(figures.entropy)):
        for head in range(figures.heads_of(layer)):
            values = figures.head(layer, head)
            lines.append(f"| {layer} | {head} | " + " | ".join(format_figure(values[n]) for n in names) + " |")
    return "\n".join(lines)
