"""The doctor's verdicts: the one table (verdict → severity, rule, likely cause, what to try), the thresholds its rules
name, and a Finding (a verdict about a place in the model, with the figures that led to it). monitor/doctor.py turns
figures into Findings; each check of monitor/units.py gives its group of these verdicts (a check of one layer alone
carries its own), and docs/DOCTOR.md prints the table from them, with the figures measured on healthy runs and on
planted bugs that set each threshold.
"""

import math
from dataclasses import asdict, dataclass

from monitor.loss_contract import LOSS_TOLERANCE
from monitor.thresholds import FORMULA_TOLERANCE, INVARIANCE, SCALE_FACTOR


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
PRIOR_LOSS = 0.95  # the training loss at least this share of the class prior's entropy (guessing the prior) ...
CHANCE_MARGIN = 0.01  # ... or validation balanced accuracy (mean recall of the classes seen) within this of a
# constant answer's, 1 / classes: whatever the classes' shares in the texts validated, a constant answer gets exactly that
NOT_LEARNING_EPOCH = 2  # ... at a validation of this epoch (from 0) or later: a healthy slow start is past by then
NOT_LEARNING_STEPS = 200  # ... and of this optimizer step or later: epochs cut short (limit_train_batches) reach
# epoch 2 within a few dozen steps, before a healthy slow start is over
NOT_LEARNING_TEXTS = 100  # diagnose.py judges a checkpoint's own balanced accuracy on at least this many texts: a
# model at 0.65 falls to the chance line (0.51 with two classes) on 100 texts about once in 400 draws (3 sd)

# Each check's verdicts, named once: monitor/units.py hands each group to the check that gives it.
# "verdicts": the doctor's rules on the health figures, the checks' figures and the training dynamics (doctor.py)
RULE_VERDICTS: dict[str, Verdict] = {
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
    "something-wrong": Verdict(
        "warning", f"figures no working layer gives: weight on later keys under a causal config (≥ {FUTURE_WEIGHT:g}), "
        f"two identical evaluation passes differing (abs(Δloss) ≥ {UNSTEADY:g}), or non-finite weights",
        "attention computes something other than softmax(q kᵀ · scale) v over the allowed keys",
        "test attention() against a reference (tests/test_formula.py) and read the figures in the warning"),
    "unstable-training": Verdict(
        "warning", f"non-finite training loss, or update_ratio ≥ {UPDATE_RATIO:g} (each optimizer step moves the "
        "attention weights by that share of their size)",
        "the learning rate is far too high for these weights",
        "lower --model.lr (by 10× to start with), keep the warm-up"),
    "weight-not-learning": Verdict(
        "warning", "a parameter that should learn gets no gradient, is not held by the optimizer, never moves, "
        "has requires_grad off, or is kept where the network does not register it (a plain list)",
        "a stray .detach(), a module kept in a plain Python list (the optimizer never sees it), requires_grad left "
        "off, or an optimizer built on other parameters",
        "follow the named parameter from the loss back to it: no .detach() on the way, nn.ModuleList for lists of "
        "modules, requires_grad on, the optimizer built on model.parameters()"),
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
    "averaging-head": Verdict(
        "note", f"entropy ≥ {AVERAGING_ENTROPY:g} with no bug-class figure: the head spreads its weight evenly",
        "a head that averages its keys (a bag of words); \"needed\" when zeroing it raises the validation loss by "
        f"≥ {NEEDED_LOSS:g}, \"unused\" when it does not",
        "nothing, if accuracy is fine; an unused one can be pruned (prune.py)"),
    "still-learning": Verdict(
        "note", f"the training loss fell by more than {STILL_LEARNING:.0%} over the last epoch",
        "the model is still learning: its attention will change",
        "judge the maps again after a few more epochs"),
    "no-data": Verdict(
        "note", "no real query had two or more keys to attend to", "every text is one token long",
        "nothing to judge"),
}
# "model-checks": the model run again on a validation sample (monitor/checks.py)
MODEL_CHECK_VERDICTS: dict[str, Verdict] = {
    "positions-unused": Verdict(
        "warning", f"order_sensitivity or position_sensitivity < {ORDER_SENSITIVITY:g} though the config gives "
        "positions: shuffling a text's tokens (full attention), or zeroing its position vectors, changes no "
        "prediction",
        "position vectors never reach the model (dropped before the first layer, or zero)",
        "add the position embedding to the token embedding before the first attention layer"),
    "unused-head": Verdict(
        "note", f"abs(head_loss_delta) < {UNUSED_LOSS:g}: zeroing the head's output leaves the validation loss as "
        "it is",
        "the model does not use this head (yet)",
        "nothing; or fewer heads"),
}
# "contract": each layer and block against its definition (monitor/contract.py)
CONTRACT_VERDICTS: dict[str, Verdict] = {
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
    "invariance-broken": Verdict(
        "warning", f"a prediction moves by ≥ {INVARIANCE:g} when its text's batch is padded further (padding) or "
        "when the text is run alone instead of with its batch (neighbours)",
        "padding or other texts of the batch reach a text's prediction: a mask not applied somewhere (attention, "
        "pooling), or a computation across the batch",
        "apply the padding mask from the lengths in every step that mixes tokens; nothing may mix texts"),
    "computes-formula": Verdict(
        "note", f"every stage of the layer matches its kind's definition recomputed from its own input and weights "
        f"(largest difference < {FORMULA_TOLERANCE:g})",
        "the layer computes the formula: softmax(Q Kᵀ · scale) V over the keys its kind defines, then W_O",
        "nothing"),
    "user-class": Verdict(
        "note", "the layer is a user's own class (--model.network.attention file.py:Class)",
        "its formula is not recomputed during training: diagnose.py --attention checks the class alone",
        "diagnose.py --attention file.py:Class"),
}
# "settings": the settings that change the formula, the optimizer's parameter groups
SETTING_VERDICTS: dict[str, Verdict] = {
    "formula-setting": Verdict(
        "warning", f"the config's scale is ≥ {SCALE_FACTOR:g}× or ≤ 1/{SCALE_FACTOR:g} of 1/√d_k",
        "a network setting changes the formula: the scores are that many times too large (a saturated softmax) or "
        "too small (uniform rows); the weights may grow to hide it, the setting stays",
        "leave --model.network.scale unset (1/√d_k), or set it near 1/√d_head"),
    "optimizer-setting": Verdict(
        "warning", "the optimizer holds parameters with another learning rate (a group's initial one, before the "
        "schedule) or weight decay than the run configured (model.lr; model.weight_decay on matrices, none on "
        "biases, LayerNorm gains and embeddings by design)",
        "the optimizer is not the configured one: a setting changed in the module after the run was configured, "
        "parameter groups built by hand (layer-wise rates), or a run resumed with other settings",
        "build the optimizer from the configured model.lr and model.weight_decay (training/optimizer.py "
        "adamw_with_warmup); change settings in the config, not in the running module"),
}
VERDICTS: dict[str, Verdict] = {**RULE_VERDICTS, **MODEL_CHECK_VERDICTS, **CONTRACT_VERDICTS, **SETTING_VERDICTS}
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
