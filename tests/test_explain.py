"""Token explanations (inference/explain.py): each method against a hand computation, faithfulness figures, the
attention kinds, bad input, and predict.py --explain / --html."""

import json
import math
from pathlib import Path

import pytest
import torch

import predict
from conftest import KINDS, SYNTHETIC, save_checkpoint, tiny_classifier
from data.tokenizer import UNK_ID
from inference.explain import METHODS, EmbeddingForward, explain_ids, rollout, spearman


def ids_of(classifier, text):
    return classifier.encode([text])[0][0]


def probability(model, token_ids, target):
    with torch.no_grad():
        return float(model(torch.tensor([token_ids])).logits.softmax(-1)[0, target])


@pytest.mark.parametrize("attention", list(KINDS))
def test_occlusion_is_the_drop_in_probability_with_the_token_replaced_by_unk(attention):
    classifier = tiny_classifier(attention)
    ids = ids_of(classifier, "w1 alpha w2 beta w3 好 差")
    result = explain_ids(classifier.model, ids)
    target = result["target"]
    full = probability(classifier.model, ids, target)
    for i in range(len(ids)):
        replaced = ids[:i] + [UNK_ID] + ids[i + 1 :]
        assert result["scores"]["occlusion"][i] == pytest.approx(full - probability(classifier.model, replaced, target),
                                                                 abs=1e-6)


@pytest.mark.parametrize("attention", list(KINDS))
def test_integrated_gradients_add_up_to_the_change_from_the_unk_baseline(attention):
    classifier = tiny_classifier(attention)
    ids = ids_of(classifier, "w4 alpha w5 w6 beta")
    result = explain_ids(classifier.model, ids, ig_steps=64)
    target = result["target"]
    change = probability(classifier.model, ids, target) - probability(classifier.model, [UNK_ID] * len(ids), target)
    assert sum(result["scores"]["integrated_gradients"]) == pytest.approx(change, abs=1e-3)
    assert result["integrated_gradients_delta"] < 1e-3


def test_the_embedding_wrapper_runs_the_same_network():
    model = tiny_classifier().model
    token_ids = torch.tensor([[3, 4, 5, 6]])
    embeddings = model.token_embedding(token_ids)
    with torch.no_grad():
        assert torch.allclose(EmbeddingForward(model)(embeddings, token_ids), model(token_ids).logits.softmax(-1))


def test_gradient_times_input_matches_finite_differences_along_the_embedding():
    model = tiny_classifier().model
    ids = [3, 4, 5, 6, 7]
    result = explain_ids(model, ids)
    target, token_ids = result["target"], torch.tensor([ids])
    embeddings = model.token_embedding(token_ids).detach()
    forward = EmbeddingForward(model)
    # d/dt of p(e with token i's embedding scaled by t), at t = 1, is Σ_d e_d ∂p/∂e_d (token i's grad × input).
    for i in range(len(ids)):
        eps = 1e-3
        up, down = embeddings.clone(), embeddings.clone()
        up[0, i] *= 1 + eps
        down[0, i] *= 1 - eps
        with torch.no_grad():
            slope = (forward(up, token_ids)[0, target] - forward(down, token_ids)[0, target]) / (2 * eps)
        assert result["scores"]["grad_x_input"][i] == pytest.approx(float(slope), abs=1e-4)


def test_attention_score_is_the_mean_of_the_last_layers_rows_under_mean_pooling():
    classifier = tiny_classifier()
    ids = ids_of(classifier, "w1 w2 alpha w3")
    result = explain_ids(classifier.model, ids)
    with torch.no_grad():
        last = classifier.model(torch.tensor([ids]), need_weights=True).attention[-1].weights[0]  # (H, n, n)
    assert torch.allclose(torch.tensor(result["scores"]["attention"]), last.mean(0).mean(0), atol=1e-6)
    assert sum(result["scores"]["rollout"]) == pytest.approx(1.0, abs=1e-5)


def test_rollout_of_one_layer_is_half_attention_half_identity():
    weights = torch.tensor([[[0.5, 0.5], [0.0, 1.0]]])  # (H=1, 2, 2)
    assert torch.allclose(rollout([weights]), torch.tensor([[0.75, 0.25], [0.0, 1.0]]))
    two = rollout([weights, weights])
    assert torch.allclose(two.sum(-1), torch.ones(2))


@pytest.mark.parametrize("pooling", ["first", "max", "attention"])
def test_attention_and_rollout_follow_the_pooling(pooling):
    classifier = tiny_classifier(pooling=pooling)
    ids = ids_of(classifier, "w1 w2 alpha w3 beta")
    result = explain_ids(classifier.model, ids)
    assert sum(result["scores"]["attention"]) == pytest.approx(1.0, abs=1e-5)
    if pooling == "first":
        with torch.no_grad():
            last = classifier.model(torch.tensor([ids]), need_weights=True).attention[-1].weights[0]
        assert torch.allclose(torch.tensor(result["scores"]["attention"]), last.mean(0)[0], atol=1e-6)


def test_linformer_has_no_token_attention_and_says_so():
    classifier = tiny_classifier("linformer")
    explanation = classifier.explain(["w1 alpha w2"])[0]
    assert explanation.scores["attention"] is None and explanation.scores["rollout"] is None
    assert "not applicable" in explanation.notes["attention"]
    assert all(explanation.scores[m] is not None for m in ("grad_x_input", "integrated_gradients", "occlusion"))


def test_deletion_curve_and_spearman():
    classifier = tiny_classifier()
    ids = ids_of(classifier, "w1 w2 alpha w3 beta w4 w5")
    result = explain_ids(classifier.model, ids)
    faith = result["faithfulness"]
    assert faith["ks"] == [1, 2, 3, 4, 5]
    assert set(faith["deletion"]) == set(METHODS) | {"random"}
    target = result["target"]
    order = sorted(range(len(ids)), key=lambda i: -result["scores"]["occlusion"][i])
    top1 = ids.copy()
    top1[order[0]] = UNK_ID
    expected = probability(classifier.model, ids, target) - probability(classifier.model, top1, target)
    assert faith["deletion"]["occlusion"][0] == pytest.approx(expected, abs=1e-6)
    assert faith["deletion"]["occlusion"][0] == pytest.approx(max(result["scores"]["occlusion"]), abs=1e-6)
    assert spearman([1, 2, 3], [10, 20, 30]) == 1.0 and spearman([1, 2, 3], [3, 2, 1]) == -1.0
    assert spearman([1, 1, 1], [1, 2, 3]) is None and spearman([1], [1]) is None


def test_bad_input_is_a_one_line_error():
    classifier = tiny_classifier()
    with pytest.raises(ValueError, match="cannot be classified .*: 1: empty text"):
        classifier.explain(["w1", "   "])
    with pytest.raises(ValueError, match=r"ig_steps .* must be in 1\.\.1024, got 0"):
        classifier.explain(["w1"], ig_steps=0)
    with pytest.raises(TypeError, match="list of texts"):
        classifier.explain("w1 w2")


def test_a_text_longer_than_max_length_is_explained_as_the_model_saw_it():
    classifier = tiny_classifier()
    explanation = classifier.explain([" ".join(f"w{i % 20}" for i in range(30))])[0]
    assert len(explanation.tokens) == 12 and explanation.truncated_from == 30
    assert all(len(s) == 12 for s in explanation.scores.values())
    assert "the first 12" in explanation.notes["truncated"]


def test_cli_explain_writes_json_and_a_self_contained_page(tmp_path, capsys):
    ckpt = save_checkpoint(tiny_classifier(), tmp_path / "tiny.ckpt")
    page = tmp_path / "report.html"
    code = predict.main(["--ckpt", str(ckpt), "--explain", "--html", str(page), "w1 alpha 好 差", "  "])
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and out[1] == {"text": "  ", "error": "empty text"}
    assert set(out[0]["scores"]) == set(METHODS) and len(out[0]["scores"]["occlusion"]) == len(out[0]["tokens"])
    assert set(out[0]["faithfulness"]) == {"spearman", "deletion", "ks"}
    html = page.read_text(encoding="utf-8")
    assert "好" in html and "<script src" not in html and "<link" not in html and "http://" not in html
    assert "https://" not in html


def test_the_page_is_its_template_with_the_style_and_script_beside_it_inlined():
    from inference import report

    page = report.render(tiny_classifier().explain(["w1 alpha </script><b>x</b>"], ig_steps=2))
    for name in ("page.css", "page.js"):  # what a restyle edits is what the page holds
        assert (report.TEMPLATES / name).read_text(encoding="utf-8").strip() in page
    assert "<b>x</b>" not in page and page.count("</script>") == 2  # the data cannot close its script tag
    assert "<html" not in Path(report.__file__).read_text()  # no markup inside Python strings


def test_cli_rejects_html_without_explain_and_zero_ig_steps(tmp_path, capsys):
    ckpt = save_checkpoint(tiny_classifier(), tmp_path / "tiny.ckpt")
    for args in (["--html", "x.html"], ["--explain", "--ig-steps", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            predict.main(["--ckpt", str(ckpt), *args, "w1"])
        assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--html goes with --explain" in err and "--ig-steps: must be in 1..1024, got 0" in err


def test_faithfulness_bench_over_a_split_and_for_one_text(tmp_path, capsys):
    from bench import faithfulness

    classifier = tiny_classifier()
    classifier.label_names = ["0", "1"]
    ckpt = save_checkpoint(classifier, tmp_path / "tiny.ckpt", data=SYNTHETIC)
    assert faithfulness.main(["--ckpt", str(ckpt), "--limit", "6", "--ig-steps", "8"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["texts"] == 6 and summary["split"] == "validation"
    assert set(summary["spearman_with_occlusion"]) == {"attention", "rollout", "grad_x_input", "integrated_gradients"}
    assert set(summary["deletion"]) == set(METHODS) | {"random"} and len(summary["deletion"]["random"]["curve"]) == 5
    assert faithfulness.main(["--ckpt", str(ckpt), "--text", "w1 alpha w2"]) == 0
    one = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert one["texts"] == 1 and one["deletion"]["occlusion"]["curve"][3:] == [None, None]  # 3 tokens: k ≤ 3
    with pytest.raises(SystemExit):
        faithfulness.main(["--ckpt", str(ckpt), "--ig-steps", "0"])


def test_the_page_reads_the_monitors_latest_verdicts_from_the_checkpoint(tmp_path, capsys):
    from inference.answers import model_info
    from inference.verdicts import latest_verdicts
    from monitor.doctor import VERDICTS, Finding

    finding = Finding("padding-leak", 1, None, {"pad_weight": 0.03, "entropy": math.nan}).to_dict()
    unknown = {"verdict": "a-verdict-of-a-later-version", "layer": 0, "head": 1, "figures": {}}
    history = [{"step": 5, "epoch": 0, "findings": []}, {"step": 9, "epoch": 1, "findings": [finding, unknown]}]
    verdicts = latest_verdicts({"callbacks": {"AttentionMonitor{'num_probes': 1}": {"history": history}}})
    assert verdicts["epoch"] == 1 and verdicts["step"] == 9
    read, later = verdicts["findings"]
    assert read["verdict"] == "padding-leak" and (read["layer"], read["head"]) == (1, None)
    assert read["severity"] == "warning" and read["fix"] == VERDICTS["padding-leak"].fix  # from the one table
    assert read["figures"] == {"pad_weight": 0.03, "entropy": None}  # JSON has no NaN
    assert later["severity"] == "note" and "does not know" in later["cause"]
    for unexamined in ({}, {"callbacks": {"ModelCheckpoint": {"history": history}}},
                       {"callbacks": {"AttentionMonitor": {"history": []}}},
                       {"callbacks": {"AttentionMonitor": {"history": [{"findings": [{"layer": "x"}]}]}}}):
        assert latest_verdicts(unexamined) is None

    ckpt = save_checkpoint(tiny_classifier(), tmp_path / "tiny.ckpt")
    assert model_info([ckpt])["verdicts"] is None  # no monitor in a hand-written checkpoint
    stored = torch.load(ckpt, weights_only=True)
    stored["callbacks"] = {"AttentionMonitor": {"history": history}}
    torch.save(stored, ckpt)
    assert model_info([ckpt])["verdicts"] == verdicts
    assert model_info([ckpt, ckpt])["verdicts"] is None  # an ensemble draws no maps
    page = tmp_path / "report.html"
    assert predict.main(["--ckpt", str(ckpt), "--explain", "--html", str(page), "w1 alpha"]) == 0
    assert '"verdict": "padding-leak"' in page.read_text(encoding="utf-8")
