"""Every answer the faces give, built once: predict.py prints these objects, serve.py sends them.

    classifier = load(["lightning_logs/version_0"], device="cpu")
    [out for out, _ in prediction_outputs(classifier, ["not bad", "  "])]
    # [{"text": "not bad", "label": ..., "probabilities": {...}}, {"text": "  ", "error": "empty text"}]

A text the model cannot read (empty, or not Unicode: inference/texts.py) is found on its own before the others are
batched, and answered in its place with {"text", "error"}; a model whose numbers are NaN or infinite gives
{"text", "error": NON_FINITE}, never NaN. answer_batch answers the server's batched requests so that one request can
only fail itself.
"""

import json
import logging
from pathlib import Path

from inference.limits import IG_STEPS_DEFAULT, PREDICT_BATCH
from inference.texts import length_is_lower_bound, problem, writable

log = logging.getLogger("inference")
NON_FINITE = "the model produced non-finite probabilities (NaN/inf): the checkpoint's weights are broken"

__all__ = ["NON_FINITE", "load", "prediction_outputs", "explanation_outputs", "finite", "answer_batch",
           "token_count", "truncation_note", "model_info"]


def load(paths: list, device: str = "auto", attention: str | None = None, allow_changed: bool = False):
    """One checkpoint (or run folder): a TextClassifier; several: an Ensemble, their probabilities averaged.
    attention, allow_changed: a face's --attention-class and --allow-changed-class (a user's class, named)."""
    from inference.classifier import FACE_FLAGS, TextClassifier
    from inference.ensemble import Ensemble

    named = {"attention": attention, "allow_changed": allow_changed, "flags": FACE_FLAGS}
    if len(paths) == 1:
        return TextClassifier.from_checkpoint(paths[0], device=device, **named)
    return Ensemble.from_checkpoints(paths, device=device, **named)


def readable(texts: list[str]) -> tuple[list[int], dict[int, dict]]:
    """The positions of the texts the model can read, and the error object of each other one."""
    problems = {i: problem(text) for i, text in enumerate(texts)}
    errors = {i: {"text": writable(texts[i]), "error": why} for i, why in problems.items() if why is not None}
    return [i for i in range(len(texts)) if i not in errors], errors


def prediction_outputs(classifier, texts: list[str], *, attention: bool = False, all_heads: bool = False,
                       top_k: int | None = None, batch_size: int = PREDICT_BATCH, weights: bool = False,
                       thresholds: bool = False) -> list[tuple]:
    """The JSON object of each text, in input order, with the Prediction it came from (None for a text the model
    cannot read, whose object is {"text", "error"}). weights: compute the attention for the Prediction (heatmaps)
    without putting it in the object. thresholds (several labels a text): add "thresholds", label name → the
    probability the label needed to be in "labels"."""
    real, errors = readable(texts)
    predictions = each_alone_on_failure(lambda chosen: classifier.predict(
        chosen, attention=attention or weights, top_k=top_k, batch_size=batch_size), [texts[i] for i in real])
    by_index = dict(zip(real, predictions))
    cuts = {"thresholds": label_thresholds(classifier.label_names, classifier.thresholds)} \
        if thresholds and classifier.multi_label else {}
    return [(errors[i], None) if i in errors else
            ({"text": writable(texts[i]), "error": by_index[i]}, None) if isinstance(by_index[i], str) else
            (by_index[i].to_dict(all_heads=all_heads, attention=attention) | cuts, by_index[i])
            for i in range(len(texts))]


MODEL_FAILED = "the model failed on this text"


def each_alone_on_failure(run, texts: list[str]) -> list:
    """run(texts)'s results; when it raises (a user's class that cannot read one text: an allocation past a
    length, its own error), each text run alone, and a text that still fails gets its error line instead of a
    result: one text's failure is that text's, the others are answered (as a text the tokenizer cannot read)."""
    if not texts:
        return []
    try:
        return run(texts)
    except Exception as error:  # the model's (a user's class): told per text below
        together = error
    results, errors = [], []
    for text in texts:
        try:
            results += run([text])
        except Exception as error:
            lines = str(error).strip().splitlines()
            results.append(f"{MODEL_FAILED}: {type(error).__name__}" + (f": {lines[0][:300]}" if lines else ""))
            errors.append(error)
    if len(errors) == len(texts) and isinstance(together, ValueError) \
            and all(type(e) is type(together) and str(e) == str(together) for e in errors):
        raise together  # a request the model cannot answer at all (attention of a pruned model, ...): one line
    return results


def explanation_outputs(classifier, texts: list[str], *, attention: bool = False,
                        ig_steps: int = IG_STEPS_DEFAULT) -> list[tuple]:
    """The explanation object of each text with its Explanation (None for a text the model cannot read); attention
    adds each layer's per-head weights (the explanation page draws them)."""
    real, errors = readable(texts)
    explanations = dict(zip(real, each_alone_on_failure(lambda chosen: classifier.explain(chosen, ig_steps=ig_steps),
                                                        [texts[i] for i in real])))
    return [(errors[i], None) if i in errors else
            ({"text": writable(texts[i]), "error": explanations[i]}, None) if isinstance(explanations[i], str) else
            (explanations[i].to_dict(attention=attention), explanations[i]) for i in range(len(texts))]


def finite(out: dict) -> dict:
    """out, or {"text", "error"} when a number in it is NaN or infinite (not JSON, and a broken model)."""
    try:
        json.dumps(out, allow_nan=False)
    except ValueError:
        return {"text": out["text"], "error": NON_FINITE}
    return out


def token_count(text: str, length: int) -> str:
    """A cut text's own length in tokens, as a note says it ("at least" past what is counted)."""
    return f"{'at least ' if length_is_lower_bound(text) else ''}{length} tokens"


def truncation_note(text: str, length: int, max_length: int) -> str:
    """What a note says about a text cut to max_length tokens."""
    return f"{token_count(text, length)}, truncated to the model's max_length of {max_length}"


# ---- the server's answers -----------------------------------------------------------------------------------------


def answer_batch(classifier, requests: list, ig_steps: int = IG_STEPS_DEFAULT) -> list[dict]:
    """The answers to a batch of checked requests (inference.request.PredictRequest), in order: {"predictions",
    "notes"} each, or {"error"} for a request the model failed on. The texts of all requests that ask for the same
    thing go through the model together; when that fails, each request is answered alone, so a failure (and its
    error) belongs to the request that caused it, never to the others in its batch."""
    try:
        return answer_together(classifier, requests, ig_steps)
    except Exception:
        if len(requests) == 1:
            return [failed(requests[0])]
    answers = []
    for request in requests:
        try:
            answers += answer_together(classifier, [request], ig_steps)
        except Exception:
            answers.append(failed(request))
    return answers


def answer_together(classifier, requests: list, ig_steps: int) -> list[dict]:
    answers: list[dict | None] = [None] * len(requests)
    for attention in (False, True):
        group = [i for i, r in enumerate(requests) if not r.explain and r.attention == attention]
        if not group:
            continue
        texts = [text for i in group for text in requests[i].texts]
        pairs = iter(prediction_outputs(classifier, texts, attention=attention))
        for i in group:
            answers[i] = answer(classifier, [next(pairs) for _ in requests[i].texts])
    for i, request in enumerate(requests):
        if request.explain:
            answers[i] = answer(classifier, explanation_outputs(classifier, request.texts,
                                                                attention=request.attention, ig_steps=ig_steps))
    return answers


def failed(request) -> dict:
    log.exception("the model failed on a request of %d text(s)", len(request.texts))
    return {"error": "the model failed on this request (the server's log has the traceback); the other requests "
                     "are answered as usual"}


def answer(classifier, pairs: list[tuple]) -> dict:
    """{"predictions": the objects (NaN/inf ones as errors), "notes": a line per truncated text}."""
    notes = [f"text {i}: {truncation_note(out['text'], result.truncated_from, classifier.max_length)}"
             for i, (out, result) in enumerate(pairs) if result is not None and result.truncated_from is not None]
    return {"predictions": [finite(out) for out, _ in pairs], "notes": notes}


def model_info(paths: list, attention: str | None = None, allow_changed: bool = False) -> dict:
    """What GET /info says about the model, read from the checkpoints (safely: data/checkpoint.py), with the
    attention doctor's latest verdicts each carries (inference/verdicts.py; the page's badges)."""
    from data.checkpoint import open_checkpoint, stored_calibration, stored_label_names
    from inference.classifier import FACE_FLAGS, named_hyper_parameters
    from inference.ensemble import check_same_layout
    from inference.verdicts import latest_verdicts
    from model.config import network_config

    members = []
    for path in paths:
        file, checkpoint = open_checkpoint(path)
        labels = stored_label_names(checkpoint)
        hparams = named_hyper_parameters(file, checkpoint, attention, allow_changed, FACE_FLAGS)
        config = network_config(hparams, labels)
        multi_label = bool(checkpoint["hyper_parameters"].get("multi_label", False))
        temperature, thresholds = stored_calibration(checkpoint, file)
        if members:  # one line before any worker starts, as the Ensemble the workers build would say it
            check_same_layout(path, labels, multi_label, paths[0], members[0]["labels"], members[0]["multi_label"])
        members.append({"checkpoint": Path(file).name, "labels": labels, "attention": config.attention,
                        "max_length": config.max_length, "network": config.to_dict(), "multi_label": multi_label,
                        "temperature": temperature,
                        "thresholds": label_thresholds(labels, thresholds) if multi_label else None,
                        "training": training_figures(checkpoint), "verdicts": latest_verdicts(checkpoint)})
    first = members[0]
    # Several labels a text: the thresholds the answers use (an ensemble's: each label's averaged, as it answers).
    thresholds = {name: sum(m["thresholds"][name] for m in members) / len(members) for name in first["labels"]} \
        if first["multi_label"] else None
    return {"labels": first["labels"], "attention": first["attention"], "multi_label": first["multi_label"],
            "thresholds": thresholds,
            "max_length": min(member["max_length"] for member in members), "ensemble": len(members) > 1,
            "verdicts": first["verdicts"] if len(members) == 1 else None, "checkpoints": members}


def label_thresholds(labels: list[str], thresholds: list[float] | None) -> dict[str, float]:
    """label name → the probability its label needs to be in an answer (several labels a text; 0.5 unfitted)."""
    return dict(zip(labels, thresholds or [0.5] * len(labels)))


def training_figures(checkpoint: dict) -> dict:
    """Epochs, steps, the data it was trained on and the monitored validation figure a train.py checkpoint records.
    The data: its own files when train.py was given --data.train_file (the dataset name is then a default the run
    ignored), else the registered dataset."""
    figures = {"epochs": checkpoint.get("epoch", -1) + 1, "global_step": checkpoint.get("global_step")}
    data = checkpoint.get("datamodule_hyper_parameters")
    if isinstance(data, dict):
        if data.get("train_file"):
            figures["train_file"] = str(data["train_file"])
            figures["val_file"] = None if data.get("val_file") is None else str(data["val_file"])
        else:
            figures["dataset"] = data.get("dataset")
    for name, state in (checkpoint.get("callbacks") or {}).items():
        if name.startswith("ModelCheckpoint") and isinstance(state, dict) and state.get("monitor"):
            score = state.get("best_model_score")
            figures["monitor"] = state["monitor"]
            figures["best_score"] = None if score is None else round(float(score), 6)
            current = state.get("current_score")
            figures["last_score"] = None if current is None else round(float(current), 6)
    return figures
