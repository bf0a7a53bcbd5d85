"""Why did the model predict that? A score per token from five methods, and how faithful each one is.

For the predicted class c and its probability p_c:

    attention     the last layer's weights, averaged over its heads, read the way the pooling reads the token
                  vectors: mean pooling → the mean over query rows; first → token 0's row; attention pooling → the
                  rows weighted by the pooling weights; max → the rows weighted by the share of features each token
                  wins. Non-negative; says where the last layer looked, not what changed the prediction.
    rollout       Abnar & Zuidema 2020: per layer the head average A, with the residual: 0.5·A + 0.5·I, rows
                  renormalised, multiplied through the layers (first layer rightmost), then read like attention.
    grad_x_input  Captum InputXGradient on the token embeddings: Σ_d e_d · ∂p_c/∂e_d (positions kept).
    integrated_gradients
                  Captum IntegratedGradients on the token embeddings, Σ_d of the attribution, from the baseline
                  "every token's embedding replaced by [UNK]'s" (positions kept) to the text, ig_steps steps
                  (Gauss-Legendre). Completeness: the scores add up to p_c(text) − p_c(baseline), up to
                  `integrated_gradients_delta`.
    occlusion     exact: Captum FeatureAblation with each token in turn *replaced by [UNK]* (the text keeps its
                  length, the other tokens their positions): p_c(text) − p_c(text with token i = [UNK]).
                  Positive: the token supports the prediction.

Faithfulness, per text: each method's Spearman rank correlation with occlusion, and a deletion curve: the top-k
tokens by the method replaced by [UNK], the drop in p_c for k = 1..5 (a random order, averaged over a few
permutations, is the floor). bench/faithfulness.py gives the same figures over a split.

Attention kinds: a kind whose keys are tokens (`keys_are_tokens`, model/kinds.py) gives token × token weights (a
long kind's own layout is unfolded to tokens with monitor.views.token_window); a kind whose keys are projections of
the whole text (linformer) has no attention or rollout scores (None, with a note); the gradient methods and
occlusion apply to every kind.
"""

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from captum.attr import FeatureAblation, InputXGradient, IntegratedGradients
from scipy.stats import spearmanr

from data.tokenizer import UNK_ID
from inference.limits import IG_STEPS, IG_STEPS_DEFAULT
from inference.probabilities import calibrated
from inference.texts import check_texts, length_is_lower_bound
from model.kinds import ATTENTION_KINDS
from monitor.views import token_window

TOKENS_PER_PASS = 16384  # tokens of one text's copies per forward pass (see texts_per_pass)
METHODS = ("attention", "rollout", "grad_x_input", "integrated_gradients", "occlusion")
SIGNED_METHODS = ("grad_x_input", "integrated_gradients", "occlusion")  # for or against the class; the others ≥ 0
DELETION_KS = (1, 2, 3, 4, 5)
RANDOM_ORDERS = 8  # random permutations averaged for the deletion floor


@dataclass
class Explanation:
    text: str
    label: str
    probabilities: dict[str, float]
    tokens: list[str]  # what the model saw (the first max_length tokens of a longer text)
    scores: dict[str, list[float] | None]  # method → one score per token, for the predicted class; None: n/a
    faithfulness: dict  # {"spearman": {method: r}, "deletion": {method: [drop at k]}, "ks": [...]}
    notes: dict[str, str]  # method → what it reflects (or why it does not apply)
    integrated_gradients_delta: float | None = None  # |Σ scores − (p_c(text) − p_c(baseline))|
    per_label: dict[str, dict] | None = None  # several labels a text: for each predicted label (the first is `label`
    # itself, whose scores are above), its own scores, faithfulness and integrated_gradients_delta
    truncated_from: int | None = None  # the text's length in tokens when it was cut to max_length
    attention: list[torch.Tensor] | None = field(default=None, repr=False)  # per layer (H, n, n), for the report

    def to_dict(self, attention: bool = False, decimals: int = 6) -> dict:
        """JSON-ready; attention: add each layer's per-head weights (H, n, n), rounded to `decimals` (None for
        linformer, whose keys are not tokens), as the explanation page draws them."""
        out = {"text": self.text, "label": self.label, "probabilities": self.probabilities, "tokens": self.tokens,
               "scores": {m: None if s is None else [round(v, 6) for v in s] for m, s in self.scores.items()},
               "faithfulness": self.faithfulness, "notes": self.notes,
               "integrated_gradients_delta": self.integrated_gradients_delta}
        if self.truncated_from is not None:
            out["truncated_from"] = self.truncated_from
        if self.per_label is not None:
            out["per_label"] = {name: {"scores": {m: None if s is None else [round(v, 6) for v in s]
                                                  for m, s in entry["scores"].items()},
                                       "faithfulness": entry["faithfulness"],
                                       "integrated_gradients_delta": entry["integrated_gradients_delta"]}
                                for name, entry in self.per_label.items()}
        if attention:
            out["attention"] = None if self.attention is None else [
                layer.double().round(decimals=decimals).tolist() for layer in self.attention]  # double: no noise
        return out


def method_notes(model) -> dict[str, str]:
    config = model.config
    pooling = {"mean": "mean over query rows (mean pooling)", "first": "the first token's row (first pooling)",
               "attention": "rows weighted by the attention-pooling weights",
               "max": "rows weighted by the share of features each token wins in max pooling"}[config.pooling]
    notes = {
        "attention": f"layer {config.n_layers - 1} (the last), mean of its heads, {pooling}",
        "rollout": f"Abnar & Zuidema 2020 over all {config.n_layers} layers (0.5·A + 0.5·I, rows renormalised), "
                   f"then {pooling}",
        "grad_x_input": "Captum InputXGradient on the token embeddings, summed over the width; target p(class)",
        "integrated_gradients": "Captum IntegratedGradients on the token embeddings, summed over the width; "
                                "baseline: every token embedding replaced by [UNK]'s (positions kept); target p(class)",
        "occlusion": "exact: p(class) minus p(class) with the token replaced by [UNK] (Captum FeatureAblation)",
    }
    if not ATTENTION_KINDS[config.attention].keys_are_tokens:
        for method in ("attention", "rollout"):
            notes[method] = f"not applicable: {config.attention}'s keys are projections of the whole text, not tokens"
    return notes


class EmbeddingForward:
    """p(class) (B, C) of the classifier with its token-embedding output replaced by given embeddings (B, L, D),
    texts without padding. The network runs its one path; a forward hook swaps the (N, D) packed embeddings."""

    def __init__(self, model):
        self.model = model

    def __call__(self, embeddings: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        swap = embeddings.reshape(-1, embeddings.shape[-1])  # (B·L, D): row-major, as the model packs real tokens
        handle = self.model.token_embedding.register_forward_hook(lambda module, inputs, output: swap)
        try:
            return output_probabilities(self.model, self.model(token_ids).logits)
        finally:
            handle.remove()


def probabilities_of(model, token_ids: torch.Tensor) -> torch.Tensor:
    """(B, C) probabilities of texts without padding."""
    return output_probabilities(model, model(token_ids).logits)


def output_probabilities(model, logits: torch.Tensor) -> torch.Tensor:
    """What each method explains: the probabilities predict gives (TextClassifier marks the network with its
    `multi_label` and `temperature`): p(class) by softmax(logits / temperature), or with several labels a text
    p(label applies) by a sigmoid per label, so one label is explained apart from the others."""
    return calibrated(logits, getattr(model, "multi_label", False), getattr(model, "temperature", 1.0))


def check_ig_steps(ig_steps: int) -> None:
    IG_STEPS.check("ig_steps (Integrated Gradients steps)", ig_steps)


def explain_ids(model, ids: list[int], ig_steps: int = IG_STEPS_DEFAULT, seed: int = 0,
                target: int | None = None) -> dict:
    """Scores per method, faithfulness figures and per-layer attention for one text's token ids (no padding), for
    the class `target` (default: the most probable)."""
    check_ig_steps(ig_steps)
    device = next(model.parameters()).device
    token_ids = torch.tensor([ids], device=device)  # (1, n)
    n = len(ids)

    captured = {}
    hook = model.blocks[-1].register_forward_hook(lambda module, inputs, output: captured.update(x=output[0]))
    try:
        with torch.no_grad():
            output = model(token_ids, need_weights=True)
    finally:
        hook.remove()
    probabilities = output_probabilities(model, output.logits)[0]  # (C,)
    target = int(probabilities.argmax()) if target is None else target
    scores: dict[str, np.ndarray | None] = {}

    tokens = ATTENTION_KINDS[model.config.attention].keys_are_tokens
    layers = [token_window(a, 0, n)[0] for a in output.attention] if tokens else None
    if layers is None:
        scores["attention"] = scores["rollout"] = None
    else:
        with torch.no_grad():
            read = pooling_read(model, captured["x"].reshape(n, -1))  # (n,) weight of each query row
        scores["attention"] = (read @ layers[-1].mean(dim=0)).cpu().numpy()
        scores["rollout"] = (read @ rollout(layers)).cpu().numpy()

    forward = EmbeddingForward(model)
    embeddings = model.token_embedding(token_ids).detach()  # (1, n, D)
    baseline = model.token_embedding(torch.full_like(token_ids, UNK_ID)).detach()  # (1, n, D)
    gxi = InputXGradient(forward).attribute(embeddings.clone().requires_grad_(), target=target,
                                            additional_forward_args=(token_ids,))
    scores["grad_x_input"] = gxi.sum(dim=-1)[0].detach().cpu().numpy()
    ig, delta = IntegratedGradients(forward).attribute(
        embeddings, baselines=baseline, target=target, additional_forward_args=(token_ids,), n_steps=ig_steps,
        internal_batch_size=texts_per_pass(n), return_convergence_delta=True)
    scores["integrated_gradients"] = ig.sum(dim=-1)[0].detach().cpu().numpy()
    with torch.no_grad():
        occlusion = FeatureAblation(lambda t: probabilities_of(model, t)).attribute(
            token_ids, baselines=UNK_ID, target=target, feature_mask=torch.arange(n, device=device)[None],
            perturbations_per_eval=min(n, texts_per_pass(n)))
        scores["occlusion"] = occlusion[0].cpu().numpy()
        faithfulness = faithfulness_of(model, token_ids, target, scores, seed=seed)
    return {"target": target, "probabilities": probabilities.tolist(), "scores": scores,
            "faithfulness": faithfulness, "integrated_gradients_delta": float(delta.abs().max()),
            "attention": None if layers is None else [layer.detach().cpu() for layer in layers]}


def texts_per_pass(n: int) -> int:
    """Copies of an n-token text one forward pass takes (Integrated Gradients' steps, occlusion's perturbations):
    TOKENS_PER_PASS tokens in all, so memory stays flat whatever ig_steps and the text's length."""
    return max(1, TOKENS_PER_PASS // n)


def pooling_read(model, x: torch.Tensor) -> torch.Tensor:
    """(n,) how much each token's final vector x (n, D) counts in the sentence vector, summing to 1."""
    n = x.shape[0]
    pooling = model.config.pooling
    if pooling == "first":
        return torch.nn.functional.one_hot(torch.tensor(0), n).to(x)
    if pooling == "attention":
        return model.attention_pool.score(x).squeeze(-1).softmax(dim=-1)
    if pooling == "max":
        return torch.bincount(x.argmax(dim=0), minlength=n).to(x) / x.shape[1]
    return torch.full((n,), 1.0 / n, dtype=x.dtype, device=x.device)


def rollout(layers: list[torch.Tensor]) -> torch.Tensor:
    """Attention rollout (n, n) from per-layer weights (H, n, n): Π over layers of rownorm(0.5·mean_h A + 0.5·I)."""
    n = layers[0].shape[-1]
    eye = torch.eye(n, dtype=layers[0].dtype, device=layers[0].device)
    result = eye
    for weights in layers:
        mixed = 0.5 * weights.mean(dim=0) + 0.5 * eye  # (n, n)
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        result = mixed @ result  # later layers on the left: row i of layer l reads the rows of layer l − 1
    return result


def faithfulness_of(model, token_ids: torch.Tensor, target: int, scores: dict, seed: int = 0) -> dict:
    """Spearman of each method with occlusion, and the deletion curve (drop of p(target) with the top-k tokens by
    each method replaced by [UNK], k in DELETION_KS capped at the text's length), random orders as the floor."""
    n = token_ids.shape[1]
    ks = [k for k in DELETION_KS if k <= n]
    orders = {m: np.argsort(-s, kind="stable") for m, s in scores.items() if s is not None}
    rng = np.random.default_rng(seed)
    randoms = [rng.permutation(n) for _ in range(RANDOM_ORDERS)]
    rows = [(name, order, k) for name, order in list(orders.items()) + [("random", o) for o in randoms] for k in ks]
    deleted = token_ids.repeat(len(rows) + 1, 1)  # (rows + 1, n): row 0 the text itself
    for row, (_, order, k) in enumerate(rows, start=1):
        deleted[row, torch.as_tensor(order[:k].copy(), device=token_ids.device)] = UNK_ID
    step = texts_per_pass(n)
    p = torch.cat([probabilities_of(model, deleted[i : i + step])[:, target] for i in range(0, len(deleted), step)])
    p = p.cpu().numpy()
    drops: dict[str, list[float]] = {}
    for (name, _, _), drop in zip(rows, p[0] - p[1:]):
        drops.setdefault(name, []).append(float(drop))
    if randoms:
        drops["random"] = np.mean(np.array(drops["random"]).reshape(RANDOM_ORDERS, len(ks)), axis=0).tolist()
    return {
        "spearman": {m: spearman(s, scores["occlusion"]) for m, s in scores.items()
                     if s is not None and m != "occlusion"},
        "deletion": {m: [round(d, 6) for d in v] for m, v in drops.items()},
        "ks": ks,
    }


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Rank correlation (ties get their mean rank); None when either side is constant or has < 2 tokens."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:  # spearmanr would warn and give nan
        return None
    r = float(spearmanr(a, b).statistic)
    return None if math.isnan(r) else round(r, 6)


def explain(classifier, texts: list[str], ig_steps: int = IG_STEPS_DEFAULT) -> list[Explanation]:
    """One Explanation per text (TextClassifier.explain). Texts longer than max_length are explained as the model
    saw them: their first max_length tokens, with truncated_from set."""
    texts = check_texts(texts, "explain")
    check_ig_steps(ig_steps)
    model = classifier.model
    notes = method_notes(model)
    ids, tokens, full_lengths = classifier.encode(texts)
    explanations = []
    for i, text in enumerate(texts):
        result = explain_ids(model, ids[i], ig_steps=ig_steps)
        target, per_label = result["target"], None
        if getattr(classifier, "multi_label", False):  # an explanation per predicted label, the most probable first
            _, labels = classifier.answer(result["probabilities"])
            targets = [classifier.label_names.index(name) for name in labels] or [target]
            target = targets[0]
            results = [result if t == result["target"] else explain_ids(model, ids[i], ig_steps=ig_steps, target=t)
                       for t in targets]
            result = results[0]
            per_label = {classifier.label_names[t]: {
                "scores": {m: None if s is None else [float(v) for v in s] for m, s in r["scores"].items()},
                "faithfulness": r["faithfulness"], "integrated_gradients_delta": r["integrated_gradients_delta"]}
                for t, r in zip(targets, results)}
        truncated = full_lengths[i] if full_lengths[i] > len(ids[i]) else None
        text_notes = dict(notes)
        if truncated:
            at_least = "at least " if length_is_lower_bound(text) else ""
            text_notes["truncated"] = (f"the text has {at_least}{truncated} tokens; the model saw and these scores "
                                       f"explain the first {len(ids[i])} (max_length)")
        explanations.append(Explanation(
            text=text, label=classifier.label_names[target],
            probabilities=dict(zip(classifier.label_names, result["probabilities"])),
            tokens=tokens[i],
            scores={m: None if s is None else [float(v) for v in s] for m, s in result["scores"].items()},
            faithfulness=result["faithfulness"], notes=text_notes,
            integrated_gradients_delta=result["integrated_gradients_delta"], truncated_from=truncated,
            attention=result["attention"], per_label=per_label,
        ))
    return explanations
