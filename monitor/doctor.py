"""The attention doctor: verdicts that name a cause and a fix, each backed by the figures that led to it.

`VERDICTS` is the one table (verdict → severity, rule, likely cause, what to try); the checks of monitor/units.py
claim its verdicts (and add their own to it), and docs/DOCTOR.md prints it from them, with the figures measured on
healthy runs and on planted bugs that set each threshold. `diagnose()`, the built-in "verdicts" check, turns one
validation pass's figures (monitor/health.py: what the layers computed, against the batch's own lengths), the
model checks on a validation sample (monitor/checks.py: heads zeroed one at a time, tokens shuffled, the weights'
own head slices) and the training dynamics (loss, update/weight ratio per optimizer step) into Findings.

A warning is a bug class: something the figures show a working layer cannot do (weight on padding, rows that do
not sum to one, every head's scores far below any initialised layer's). A note is information: a head that
averages on purpose, a head the loss does not need, a model still learning. Entropy alone never makes a warning:
healthy models sit at entropy 0.95-0.98 after their first epochs.
"""

import math
from dataclasses import asdict, dataclass

from monitor.health import HealthFigures
from monitor.loss_contract import LOSS_TOLERANCE


@dataclass(frozen=True)
class Verdict:
    severity: str  # "warning" (a bug class) or "note" (informational)
    rule: str
    cause: str
    fix: str


# Thresholds, each between what healthy runs and planted bugs measured: docs/DOCTOR.md "Where the lines are" holds
# both sides of every line (the runs, the ranges, the command); the comments here say what each line is.
PAD_WEIGHT = 1e-4  # weight on padded keys: a working mask gives them exactly 0
REAL_ZERO_SHARE = 0.5  # share of rows giving every real key exactly 0: an inverted mask's rows
ROW_SUM_ERROR = 1e-3  # |row sum − 1|: float rounding stays orders of magnitude below
FUTURE_ZERO_SHARE = 0.9  # non-causal rows that give all later keys exactly 0: a look-ahead mask's rows
FUTURE_WEIGHT = 1e-4  # causal configs: weight on later keys, exactly 0 when the mask works
SMALL_SCORE_STD = 0.02  # the largest score spread of a layer's heads: far below any initialised layer's
SATURATED_GRADIENT_PASS = 0.3  # every head of a layer passes less than this share of gradient (a healthy head that
# attends sharply after long training passes more) ...
SATURATED_SCORE_STD = 8.0  # ... with a score spread at least this (that healthy head's spread stays below)
SAME_SCORES = 0.9  # score correlation of two heads: independently initialised heads stay far below, copies give 1
SAME_WEIGHTS = 0.5  # ... with their W_Q, W_K, W_V slices this alike (cosine)
UPDATE_RATIO = 0.04  # mean ‖ΔW‖/‖W‖ of the attention projections per optimizer step
ORDER_SENSITIVITY = 1e-5  # mean |Δp|, tokens shuffled or positions zeroed: float noise when positions never arrive
UNSTEADY = 1e-5  # |Δloss| between two identical evaluation passes: exactly 0 for a deterministic network
AVERAGING_ENTROPY = 0.95  # a head this uniform averages its keys
NEEDED_LOSS = 0.005  # Δloss when the head is zeroed: above this the loss needs it
UNUSED_LOSS = 0.001  # |Δloss| below this: the loss does not need the head
STILL_LEARNING = 0.05  # the training loss fell by more than this share over the last epoch
FORMULA_TOLERANCE = 1e-3  # a layer's stage against its kind's definition recomputed (monitor/contract.py): float32
# rounding stays orders of magnitude below; the smallest planted change (weights × 0.5) gives 0.5
SCALE_FACTOR = 4.0  # a configured scale this many times 1/√d_k, or 1/this, breaks the formula (1.0 with heads of 16
# is 4×; 0.001 with heads of 16 is 0.004×)
INVARIANCE = 1e-4  # max |Δp| when a text is padded further or run alone: float rounding stays orders below
PRIOR_LOSS = 0.95  # the training loss at least this share of the class prior's entropy (guessing the prior) ...
CHANCE_MARGIN = 0.01  # ... or validation balanced accuracy (mean recall of the classes seen) within this of a
# constant answer's, 1 / classes: whatever the classes' shares in the texts validated, a constant answer gets exactly that
NOT_LEARNING_EPOCH = 2  # ... at a validation of this epoch (from 0) or later: a healthy slow start is past by then
NOT_LEARNING_STEPS = 200  # ... and of this optimizer step or later: epochs cut short (limit_train_batches) reach
# epoch 2 within a few dozen steps, before a healthy slow start is over
NOT_LEARNING_TEXTS = 100  # diagnose.py judges a checkpoint's own balanced accuracy on at least this many texts: a
# model at 0.65 falls to the chance line (0.51 with two classes) on 100 texts about once in 400 draws (3 sd)

VERDICTS: dict[str, Verdict] = {
    "padding-leak": Verdict(
        "warning", f"pad_weight ≥ {PAD_WEIGHT:g}: real queries put weight on keys that are padding by the batch's "
        "lengths",
        "the padding mask is not applied to the keys (ignored, built from token ids, or broadcast along the query "
        "axis), so padding changes the output",
        "build the mask from the lengths, shape (B, 1, 1, L) over the keys, and fill blocked scores with a huge "
        "negative number before softmax"),
    "mask-inverted": Verdict(
        "warning", f"real_zero_share ≥ {REAL_ZERO_SHARE:g} and pad_weight ≥ {PAD_WEIGHT:g}: rows give every real "
        "key exactly 0 and their weight to padding",
        "the mask's meaning is flipped (True = attend where the code expects True = blocked)",
        "check the mask convention where it is built: blocked = padding, not ~padding"),
    "rows-not-normalized": Verdict(
        "warning", f"row_sum_error ≥ {ROW_SUM_ERROR:g}: a query's weights do not sum to 1",
        "softmax over the wrong axis (the queries instead of the keys), weights rescaled after softmax, or every "
        "key of a row blocked",
        "take softmax over the last (key) axis, dim=-1, and leave the weights as softmax made them"),
    "unasked-look-ahead": Verdict(
        "warning", f"future_zero_share ≥ {FUTURE_ZERO_SHARE:g} while the config is not causal: later tokens get "
        "exactly 0",
        "a look-ahead (causal) mask is applied though the config does not ask for one, so each token only sees "
        "the ones before it",
        "drop the triangular mask (a user's class: from its forward, which blocks what it blocks), or, for a "
        "built-in kind, set network.causal if it is meant"),
    "saturated": Verdict(
        "warning", f"every head of a layer: gradient_pass < {SATURATED_GRADIENT_PASS:g} and score_std ≥ "
        f"{SATURATED_SCORE_STD:g}",
        "scores far too large (no 1/√d_k with a large head, a scale of 1.0, runaway weights): softmax is one-hot and "
        "passes almost no gradient",
        "scale the scores by 1/√d_k, lower the learning rate or the initial weights"),
    "scale-too-small": Verdict(
        "warning", f"every head of a layer: score_std < {SMALL_SCORE_STD:g}, far below what any initialised layer "
        "has",
        "the scores are multiplied by a scale far too small, so every row is uniform and tokens cannot be told apart",
        "check the scale is 1/√d_k (not 1/d_k², not a tiny temperature)"),
    "identical-heads": Verdict(
        "warning", f"two heads of a layer score alike, score_correlation ≥ {SAME_SCORES:g}, from alike weights, "
        f"weight_similarity ≥ {SAME_WEIGHTS:g} (when the model checks ran)",
        "the heads started from the same weights (one head copied into all), so they learn the same thing",
        "initialise each head's W_Q, W_K, W_V slices independently"),
    "positions-unused": Verdict(
        "warning", f"order_sensitivity or position_sensitivity < {ORDER_SENSITIVITY:g} though the config gives "
        "positions: shuffling a text's tokens (full attention), or zeroing its position vectors, changes no "
        "prediction",
        "position vectors never reach the model (dropped before the first layer, or zero)",
        "add the position embedding to the token embedding before the first attention layer"),
    "unstable-training": Verdict(
        "warning", f"non-finite training loss, or update_ratio ≥ {UPDATE_RATIO:g} (each optimizer step moves the "
        "attention weights by that share of their size)",
        "the learning rate is far too high for these weights",
        "lower --model.lr (by 10× to start with), keep the warm-up"),
    "something-wrong": Verdict(
        "warning", f"figures no working layer gives: weight on later keys under a causal config (≥ {FUTURE_WEIGHT:g}), "
        f"two identical evaluation passes differing (abs(Δloss) ≥ {UNSTEADY:g}), or non-finite weights",
        "attention computes something other than softmax(q kᵀ · scale) v over the allowed keys",
        "test attention() against a reference (tests/test_formula.py) and read the figures in the warning"),
    "formula-broken": Verdict(
        "warning", f"a stage of the layer (scores, mask, weights, output before W_O, output) differs from its kind's "
        f"definition recomputed from the layer's own input and weights by ≥ {FORMULA_TOLERANCE:g} (relative; weights "
        "absolute); the first such stage is named, with how it differs",
        "the layer computes something other than its kind's definition, softmax(Q Kᵀ/√d_k) V over the keys it "
        "should see: the named stage is where the code departs from it",
        "read the line that makes the named stage (model/attention.py attention(), the kind's attend or mask) "
        "against the formula; tests/test_formula.py compares attention() with a reference"),
    "block-broken": Verdict(
        "warning", f"a step of a block differs from the block's definition recomputed from its own input, its "
        f"attention layer's output and its own weights by ≥ {FORMULA_TOLERANCE:g} (relative): its input (the "
        "embeddings of the tokens and positions, or the block before's output), its attention layer's input, the "
        "residual + LayerNorm after attention, the residual + LayerNorm after the feed-forward; the first such step "
        "is named, with how it differs",
        "the network around attention computes something other than its definition, h = LayerNorm(x + "
        "attention(x)), then LayerNorm(h + FFN(h)): a residual left out, a LayerNorm on the wrong tensor, the "
        "embeddings changed on their way to the first block",
        "read the named step in Block.forward or AttentionEncoder.encode (model/classifier.py) against the "
        "definition"),
    "shared-weight": Verdict(
        "warning", "two parameters of the network are one tensor, share its memory, or hold exactly the same "
        "(non-constant) matrix: no network of this project ties weights",
        "one weight serves two roles (self.w_k = self.w_q: a copy-paste slip), so the layer computes another formula "
        "with fewer weights than its definition, and both roles learn as one",
        "give each projection its own nn.Linear; tie weights only on purpose"),
    "formula-setting": Verdict(
        "warning", f"the config's scale is ≥ {SCALE_FACTOR:g}× or ≤ 1/{SCALE_FACTOR:g} of 1/√d_k",
        "a network setting changes the formula: the scores are that many times too large (a saturated softmax) or "
        "too small (uniform rows); the weights may grow to hide it, the setting stays",
        "leave --model.network.scale unset (1/√d_k), or set it near 1/√d_head"),
    "weight-not-learning": Verdict(
        "warning", "a parameter that should learn gets no gradient, is not held by the optimizer, never moves, "
        "has requires_grad off, or is kept where the network does not register it (a plain list)",
        "a stray .detach(), a module kept in a plain Python list (the optimizer never sees it), requires_grad left "
        "off, or an optimizer built on other parameters",
        "follow the named parameter from the loss back to it: no .detach() on the way, nn.ModuleList for lists of "
        "modules, requires_grad on, the optimizer built on model.parameters()"),
    "optimizer-setting": Verdict(
        "warning", "the optimizer holds parameters with another learning rate (a group's initial one, before the "
        "schedule) or weight decay than the run configured (model.lr; model.weight_decay on matrices, none on "
        "biases, LayerNorm gains and embeddings by design)",
        "the optimizer is not the configured one: a setting changed in the module after the run was configured, "
        "parameter groups built by hand (layer-wise rates), or a run resumed with other settings",
        "build the optimizer from the configured model.lr and model.weight_decay (training/optimizer.py "
        "adamw_with_warmup); change settings in the config, not in the running module"),
    "loss-broken": Verdict(
        "warning", f"the loss a training step used differs by ≥ {LOSS_TOLERANCE:g} (relative) from its definition "
        "recomputed on the step's own logits and labels (cross-entropy of the logits for one label a text, binary "
        "cross-entropy of the logits for several, with the run's class weights, label smoothing and distillation), "
        "or the logits are probabilities already; the form it matches is named",
        "the loss is not the one the figures say: cross_entropy fed probabilities (softmax applied twice: its "
        "gradient is small and it cannot fall below log(1 + (C − 1)/e)), a sum where a mean is meant (the learning "
        "rate grows with the batch), a log left out",
        "give cross_entropy the raw logits (no softmax before it, none at the end of the network), reduction "
        "\"mean\"; softmax only where probabilities are shown"),
    "invariance-broken": Verdict(
        "warning", f"a prediction moves by ≥ {INVARIANCE:g} when its text's batch is padded further (padding) or "
        "when the text is run alone instead of with its batch (neighbours)",
        "padding or other texts of the batch reach a text's prediction: a mask not applied somewhere (attention, "
        "pooling), or a computation across the batch",
        "apply the padding mask from the lengths in every step that mixes tokens; nothing may mix texts"),
    "not-learning": Verdict(
        "warning", f"from epoch {NOT_LEARNING_EPOCH} and step {NOT_LEARNING_STEPS}: the training loss ≥ {PRIOR_LOSS:g} × "
        f"the entropy of the class prior (guessing the prior), or validation balanced accuracy within {CHANCE_MARGIN:g} of "
        "a constant answer's or below it (1 / classes seen; judged when the validation texts hold more than one class; "
        f"diagnose.py also judges the checkpoint itself on ≥ {NOT_LEARNING_TEXTS} texts). The cause is read from the "
        "figures: other warnings of the same pass → those; a training loss below guessing while validation stays at "
        "chance → the model validated is not the one trained, or the splits' labels disagree; both flat → the "
        "learning rate, the schedule, the optimizer, or training labels out of step with their texts",
        "the model does not learn: the finding's detail names the cause its figures point to",
        "read the contract warnings first; then compare the model trained with the one validated and both splits' "
        "labels, or the learning rate and its schedule over the steps actually taken"),
    "computes-formula": Verdict(
        "note", f"every stage of the layer matches its kind's definition recomputed from its own input and weights "
        f"(largest difference < {FORMULA_TOLERANCE:g})",
        "the layer computes the formula: softmax(Q Kᵀ · scale) V over the keys its kind defines, then W_O",
        "nothing"),
    "user-class": Verdict(
        "note", "the layer is a user's own class (--model.network.attention file.py:Class)",
        "its formula is not recomputed during training: diagnose.py --attention checks the class alone",
        "diagnose.py --attention file.py:Class"),
    "averaging-head": Verdict(
        "note", f"entropy ≥ {AVERAGING_ENTROPY:g} with no bug-class figure: the head spreads its weight evenly",
        "a head that averages its keys (a bag of words); \"needed\" when zeroing it raises the validation loss by "
        f"≥ {NEEDED_LOSS:g}, \"unused\" when it does not",
        "nothing, if accuracy is fine; an unused one can be pruned (prune.py)"),
    "unused-head": Verdict(
        "note", f"abs(head_loss_delta) < {UNUSED_LOSS:g}: zeroing the head's output leaves the validation loss as "
        "it is",
        "the model does not use this head (yet)",
        "nothing; or fewer heads"),
    "still-learning": Verdict(
        "note", f"the training loss fell by more than {STILL_LEARNING:.0%} over the last epoch",
        "the model is still learning: its attention will change",
        "judge the maps again after a few more epochs"),
    "no-data": Verdict(
        "note", "no real query had two or more keys to attend to", "every text is one token long",
        "nothing to judge"),
}
# A stored finding whose verdict this version does not know (a checkpoint from another version) is read as a note.
UNKNOWN = Verdict("note", "", "a verdict this version of the doctor does not know (the checkpoint was written by "
                  "another version)", "diagnose the checkpoint with this version (diagnose.py)")


@dataclass(frozen=True)
class Finding:
    verdict: str  # a key of VERDICTS
    layer: int | None  # None = the whole model
    head: int | None  # None = the whole layer (or model)
    figures: dict[str, float]  # the figures that led to it, named as in monitor/health.py and monitor/checks.py
    detail: str = ""  # what the figures cannot say: the stage and how it differs, the parameter, the flag

    @property
    def severity(self) -> str:
        return VERDICTS.get(self.verdict, UNKNOWN).severity

    def where(self) -> str:
        if self.layer is None:
            return "the model"
        return f"layer {self.layer}" + ("" if self.head is None else f" head {self.head}")

    def line(self) -> str:
        """One line: where, the verdict, the figures behind it, the likely cause and what to try."""
        verdict = VERDICTS.get(self.verdict, UNKNOWN)
        numbers = ", ".join(f"{name} {format_figure(value)}" for name, value in self.figures.items())
        numbers = f" ({numbers})" if numbers else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"attention {self.where()}: {self.verdict}{numbers}{detail}: {verdict.cause}; try: {verdict.fix}"

    def to_dict(self) -> dict:
        """Plain data (a checkpoint loads it with weights_only)."""
        return asdict(self) | {"figures": {name: float(value) for name, value in self.figures.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "Finding":
        """A stored finding; one without layer, head or figures (another version's) is about the whole model."""
        return cls(data["verdict"], data.get("layer"), data.get("head"), dict(data.get("figures") or {}),
                   str(data.get("detail", "")))


def format_figure(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:.3g}" if abs(value) < 1e-2 and value else f"{value:.3f}".rstrip("0").rstrip(".") or "0"


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
