"""The attention doctor: each figure on hand-made attention whose answer is known, the verdict rules, the monitor's
history in a checkpoint, and diagnose.py's exit codes."""

import math
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from data.checkpoint import CheckpointError
from model.attention import AttentionWeights
from model.classifier import AttentionClassifier
from model.config import NetworkConfig
from model.kinds import ATTENTION_KINDS
from monitor.doctor import VERDICTS, Finding, diagnose, head_titles, verdict_table_markdown, warnings
from monitor.health import AttentionHealth

B, H, L = 4, 2, 8
LENGTHS = [8, 6, 5, 3]


def padding_mask(lengths=LENGTHS, L=L):
    return torch.arange(L)[None, :] >= torch.tensor(lengths)[:, None]  # (B, L), True = padding


def layer_of(scores, blocked=None, softmax_dim=-1):
    """What a layer hands out: softmax of the scores with blocked keys at -inf (exactly 0), along softmax_dim."""
    masked = scores if blocked is None else scores.masked_fill(blocked, -math.inf)
    weights = masked.softmax(softmax_dim).nan_to_num(0.0)
    return AttentionWeights(weights, masked.nan_to_num(neginf=-1e30), blocked)


def figures_of(layer, mask=None, causal=False):
    health = AttentionHealth(causal=causal)
    health.update([layer], padding_mask() if mask is None else mask)
    return health.compute()


def verdicts(figures, **kwargs):
    return [f.verdict for f in warnings(diagnose(figures, **kwargs))]


def random_scores(seed=0, spread=1.0):
    torch.manual_seed(seed)
    return torch.randn(B, H, L, L) * spread


def key_padding(mask=None):
    return (padding_mask() if mask is None else mask)[:, None, None, :]  # (B, 1, 1, L)


def test_weight_on_padding_is_exactly_zero_with_the_mask_and_not_without():
    masked = figures_of(layer_of(random_scores(), key_padding()))
    assert masked.pad_weight.max() == 0.0 and verdicts(masked) == []
    ignored = figures_of(layer_of(random_scores()))  # the layer ignored its mask; the batch still has padding
    assert ignored.pad_weight.min() > 0.05
    assert verdicts(ignored) == ["padding-leak"]


def test_an_inverted_mask_is_named_alone():
    figures = figures_of(layer_of(random_scores(), ~key_padding()))
    assert figures.real_zero_share.min() == 1.0  # every row gives every real key exactly 0
    assert verdicts(figures) == ["mask-inverted"]


def test_rows_normalized_along_the_query_axis_are_caught():
    figures = figures_of(layer_of(random_scores(), key_padding(), softmax_dim=-2))
    assert figures.row_sum_error.min() > 0.1
    assert verdicts(figures) == ["rows-not-normalized"]
    healthy = figures_of(layer_of(random_scores(), key_padding()))
    assert healthy.row_sum_error.max() < 1e-6


def test_a_look_ahead_mask_is_a_warning_only_when_the_config_did_not_ask_for_it():
    future = torch.ones(L, L, dtype=torch.bool).triu(1)
    layer = layer_of(random_scores(), key_padding() | future)
    unasked = figures_of(layer)
    assert unasked.future_zero_share.min() == 1.0
    assert verdicts(unasked) == ["unasked-look-ahead"]
    asked = figures_of(layer, causal=True)
    assert asked.future_weight.max() == 0.0 and verdicts(asked) == []
    leaking = figures_of(layer_of(random_scores(), key_padding()), causal=True)  # causal config, no causal mask
    assert verdicts(leaking) == ["something-wrong"]


def test_identical_heads_are_caught_and_independent_ones_are_not():
    scores = random_scores()
    scores[:, 1] = scores[:, 0] * 3  # the same scoring, another spread
    figures = figures_of(layer_of(scores, key_padding()))
    assert figures.score_correlation[0, 0, 1] > 0.999
    assert verdicts(figures) == ["identical-heads"]
    independent = figures_of(layer_of(random_scores(), key_padding()))
    assert independent.score_correlation[0, 0, 1].abs() < 0.3 and verdicts(independent) == []
    # Heads that score alike from independent weights (collapsed onto the same keys) are not copies.
    apart = {"weight_similarity": [[[1.0, 0.05], [0.05, 1.0]]]}
    assert verdicts(figures, checks=apart) == []
    assert verdicts(figures, checks={"weight_similarity": [[[1.0, 0.99], [0.99, 1.0]]]}) == ["identical-heads"]


def test_a_tiny_scale_is_a_warning_but_a_healthy_uniform_head_only_a_note():
    tiny = figures_of(layer_of(random_scores(spread=0.001), key_padding()))
    assert verdicts(tiny) == ["scale-too-small"]
    # Entropy 0.98 with a spread any initialised layer has: what a healthy model shows after its first epoch.
    uniform = figures_of(layer_of(random_scores(spread=0.3), key_padding()))
    assert uniform.entropy.min() > 0.95
    findings = diagnose(uniform)
    assert warnings(findings) == [] and {f.verdict for f in findings} == {"averaging-head"}


def test_saturated_scores_are_caught_by_the_gradient_they_pass():
    figures = figures_of(layer_of(random_scores(spread=60.0), key_padding()))
    assert figures.gradient_pass.max() < 0.2
    assert verdicts(figures) == ["saturated"]


def test_model_rules_read_the_training_dynamics_and_the_order_check():
    figures = figures_of(layer_of(random_scores(), key_padding()))
    learned = NetworkConfig(positions="learned")
    assert verdicts(figures, dynamics={"update_ratio": 0.5}) == ["unstable-training"]
    assert verdicts(figures, dynamics={"update_ratio": 0.01}) == []
    assert verdicts(figures, checks={"order_sensitivity": 1e-8}, config=learned) == ["positions-unused"]
    assert verdicts(figures, checks={"order_sensitivity": 1e-8}, config=NetworkConfig(positions="none")) == []
    assert verdicts(figures, checks={"order_sensitivity": 0.05}, config=learned) == []
    assert verdicts(figures, checks={"position_sensitivity": 0.0}, config=learned) == ["positions-unused"]


def test_the_model_checks_see_zeroed_positions_and_copied_heads():
    from monitor.checks import model_checks

    torch.manual_seed(0)
    model = AttentionClassifier(NetworkConfig(vocab_size=30, num_classes=2, max_length=L, d_model=16, n_heads=H,
                                              attention="local", window=2))
    batch = {"input_ids": torch.randint(2, 30, (B, L)), "padding_mask": padding_mask(),
             "labels": torch.tensor([0, 1, 0, 1])}
    checks = model_checks(model, [batch])
    assert checks["position_sensitivity"] > 1e-4 and math.isnan(checks["order_sensitivity"])  # local: no shuffle
    assert abs(checks["weight_similarity"][0][0][1]) < 0.5 and checks["unsteady_loss"] == 0.0
    assert len(checks["head_loss_delta"][0]) == H and model.training  # left as it was found
    with torch.no_grad():
        model.position_embedding.weight.zero_()  # positions that never reach the model
        attention = model.blocks[0].attention
        for linear in (attention.w_q, attention.w_k, attention.w_v):
            linear.weight.view(H, -1)[1] = linear.weight.view(H, -1)[0]
    checks = model_checks(model, [batch])
    assert checks["position_sensitivity"] == 0.0 and checks["weight_similarity"][0][0][1] > 0.999


@pytest.mark.parametrize("kind", list(ATTENTION_KINDS))
def test_every_kind_has_clean_mask_figures_and_an_ignored_mask_leaks(kind):
    torch.manual_seed(0)
    config = NetworkConfig(vocab_size=30, num_classes=2, max_length=L, d_model=16, n_heads=H, attention=kind,
                           window=2, projection_length=4, global_tokens=1)
    model = AttentionClassifier(config).eval()
    ids = torch.randint(2, 30, (B, L))
    attention = model(ids, padding_mask(), need_weights=True).attention
    health = AttentionHealth()
    health.update(attention, padding_mask())
    figures = health.compute()
    assert figures.row_sum_error.max() < 1e-5
    assert verdicts(figures) == []
    if not ATTENTION_KINDS[kind].keys_are_tokens:  # linformer's projected keys: no padding to weigh
        assert figures.pad_weight.isnan().all()
        return
    assert figures.pad_weight.max() == 0.0
    ignored = AttentionHealth()
    ignored.update(model(ids, None, need_weights=True).attention, padding_mask())  # unmasked
    assert verdicts(ignored.compute()) == ["padding-leak"]


def test_findings_are_plain_data_and_titles_carry_the_verdict(tmp_path):
    findings = [Finding("padding-leak", 0, None, {"pad_weight": 0.2}),
                Finding("averaging-head", 1, 0, {"entropy": 0.98})]
    path = tmp_path / "findings.pt"
    torch.save([f.to_dict() for f in findings], path)
    assert [Finding.from_dict(f) for f in torch.load(path, weights_only=True)] == findings
    assert head_titles(findings, [2, 2]) == [["padding-leak", "padding-leak"], ["averaging-head", "ok"]]
    table = verdict_table_markdown(findings)
    assert "| layer 0 | padding-leak | warning | pad_weight 0.2 |" in table and VERDICTS["padding-leak"].fix in table
    assert "pad_weight 0.2" in findings[0].line() and VERDICTS["padding-leak"].cause in findings[0].line()


def test_the_monitor_history_is_in_the_checkpoint(smoke_run):
    from conftest import SMOKE_EPOCHS

    checkpoint = torch.load(smoke_run.last, weights_only=True)
    (state,) = [v for k, v in checkpoint["callbacks"].items() if "AttentionMonitor" in k]
    assert [entry["epoch"] for entry in state["history"]] == list(range(SMOKE_EPOCHS))
    findings = [Finding.from_dict(f) for entry in state["history"] for f in entry["findings"]]
    assert all(f.verdict in VERDICTS for f in findings)
    assert warnings(findings) == []  # a healthy run: notes at most


def diagnose_cli(*args):
    return subprocess.run([sys.executable, "diagnose.py", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.slow
def test_diagnose_exit_codes(smoke_run, tmp_path):
    healthy = diagnose_cli("--ckpt", str(smoke_run.run), "--texts", "100", "--out", str(tmp_path))
    assert healthy.returncode == 0, healthy.stderr
    assert "0 warnings" in healthy.stdout and (tmp_path / "diagnosis.html").read_text().count("<img") == 2

    broken = tmp_path / "tiny_scale.ckpt"
    checkpoint = torch.load(smoke_run.best, weights_only=True)
    checkpoint["state_dict"]["model.blocks.0.attention.w_q.weight"] *= 1e-5  # every score ~0: scale-too-small
    torch.save(checkpoint, broken)
    sick = diagnose_cli("--ckpt", str(broken), "--texts", "100", "--html", str(tmp_path / "sick.html"))
    assert sick.returncode == 1, sick.stderr
    assert "scale-too-small" in sick.stdout and "scale-too-small" in (tmp_path / "sick.html").read_text()

    for args in (["--ckpt", str(tmp_path / "missing.ckpt")], ["--ckpt", str(smoke_run.best), "--texts", "0"]):
        bad = diagnose_cli(*args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    bad = diagnose_cli("--ckpt", str(garbage))
    assert bad.returncode == 2 and str(garbage) in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


# --- bad input to diagnose.py: each refused in one line before any data is read, nothing saved is touched -----------

def diagnose_main(capsys, *args):
    import diagnose

    code = diagnose.main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_data_read(monkeypatch):
    """Reading the data fails the test: a refusal must come before it."""
    import inference.diagnosis

    def read(**settings):
        raise AssertionError("the data were read before the refusal")
    monkeypatch.setattr(inference.diagnosis, "load_splits", read)


def test_diagnose_refuses_its_own_inputs_and_unusable_targets_before_reading_data(tiny_checkpoint, tmp_path, capsys,
                                                                                 no_data_read):
    from conftest import digest, write_csv

    data = write_csv(tmp_path / "reviews.csv", [("good", "pos"), ("bad", "neg")] * 5)
    saved = digest(tiny_checkpoint), digest(data)
    (tmp_path / "afile").write_text("x")
    for flags, said in ((["--html", tiny_checkpoint], "own input"),
                        (["--html", data, "--data.train_file", data], "own input"),
                        (["--html", tmp_path / "missing" / "r.html"], "does not exist"),
                        (["--html", tmp_path], "is a directory"),
                        (["--out", tmp_path / "afile"], "is not a folder")):
        code, out, err = diagnose_main(capsys, "--ckpt", tiny_checkpoint, *flags)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, (flags, err)
    assert (digest(tiny_checkpoint), digest(data)) == saved


@pytest.mark.parametrize("value", ["0", "-0.1", "1", "1.5", "nan", "half"])
def test_diagnose_val_fraction_is_a_share_between_0_and_1(value, capsys):
    import diagnose

    with pytest.raises(SystemExit) as stop:
        diagnose.parse_args(["--ckpt", "x.ckpt", "--data.val_fraction", value])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--data.val_fraction" in err and len(err.strip().splitlines()) == 1


def test_a_checkpoint_without_data_settings_names_the_flags_instead_of_reading_sst2(tmp_path, capsys, no_data_read):
    from conftest import save_checkpoint, tiny_classifier

    bare = save_checkpoint(tiny_classifier(), tmp_path / "bare.ckpt")
    code, out, err = diagnose_main(capsys, "--ckpt", bare)
    assert code == 2 and "--data.dataset" in err and "--data.train_file" in err and len(err.strip().splitlines()) == 1


def with_history(path, history):
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["callbacks"] = {"AttentionMonitor{'num_probes': 4}": {"history": history}}
    torch.save(checkpoint, path)
    return path


def test_a_stored_finding_of_another_version_is_read_as_a_note():
    future = Finding.from_dict({"verdict": "a-verdict-of-tomorrow"})  # no layer, head or figures either
    assert (future.severity, future.layer, future.head, future.figures) == ("note", None, None, {})
    assert "does not know" in future.line() and "a-verdict-of-tomorrow" in verdict_table_markdown([future])
    assert warnings([future]) == []


@pytest.mark.slow
def test_diagnose_shows_a_history_of_another_version_and_refuses_one_it_cannot_read(tiny_checkpoint, tmp_path,
                                                                                   capsys):
    with_history(tiny_checkpoint, [{"step": 5, "epoch": 0, "findings": [{"verdict": "a-verdict-of-tomorrow"}]}])
    code, out, err = diagnose_main(capsys, "--ckpt", tiny_checkpoint, "--texts", "20", "--out", tmp_path)
    assert code == 0 and "notes: a-verdict-of-tomorrow" in out, err

    with_history(tiny_checkpoint, [{"findings": 3}])
    code, out, err = diagnose_main(capsys, "--ckpt", tiny_checkpoint, "--out", tmp_path)
    assert code == 2 and "history" in err and len(err.strip().splitlines()) == 1, err


# --- not-learning: the rule, its cause read from the figures, and the whole run's history -------------------------

LEARNING = {"epoch": 3, "step": 300, "prior_loss": 0.693, "classes_seen": 2}


def test_not_learning_reads_its_cause_from_the_figures():
    from monitor.doctor import not_learning

    fell = not_learning(LEARNING | {"train_loss": 0.26, "balanced_accuracy": 0.48}, [])
    assert "not the one trained" in fell.detail and "labels disagree" in fell.detail
    flat = not_learning(LEARNING | {"train_loss": 0.69, "balanced_accuracy": 0.50}, [])
    assert "learning rate, the schedule or the optimizer" in flat.detail
    stuck = Finding("weight-not-learning", None, None, {}, "head.weight: the optimizer never moved it")
    assert "weight-not-learning" in not_learning(LEARNING | {"train_loss": 0.69, "balanced_accuracy": 0.5},
                                                 [stuck]).detail
    assert not_learning(LEARNING | {"train_loss": 0.1, "balanced_accuracy": 0.9}, []) is None  # it learns
    assert not_learning(LEARNING | {"epoch": 1, "train_loss": 0.69, "balanced_accuracy": 0.5}, []) is None  # too early
    below = not_learning(LEARNING | {"train_loss": 0.2, "balanced_accuracy": 0.05}, [])  # below chance counts too
    assert below is not None and "not the one trained" in below.detail


def test_the_run_history_joins_the_last_checkpoint_of_the_same_run(tiny_checkpoint, tmp_path):
    from inference.diagnosis import run_history

    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    early = [{"step": 10, "epoch": 0, "findings": []}]
    stuck = {"verdict": "not-learning", "layer": None, "head": None, "figures": {"balanced_accuracy": 0.5}}
    later = early + [{"step": 300, "epoch": 3, "findings": [stuck], "figures": {"train_loss": 0.26}}]
    best = with_history(tiny_checkpoint, early).rename(folder / "best-epoch0.ckpt")
    checkpoint = torch.load(best, weights_only=True)
    torch.save(checkpoint | {"callbacks": {"AttentionMonitor": {"history": later}}}, folder / "last.ckpt")
    history, sources = run_history(best, checkpoint)
    assert [entry["step"] for entry in history] == [10, 300] and sources == [best, folder / "last.ckpt"]
    assert history[1]["findings"][0].verdict == "not-learning" and history[1]["figures"] == {"train_loss": 0.26}
    assert run_history(folder / "last.ckpt", torch.load(folder / "last.ckpt", weights_only=True))[1] == [
        folder / "last.ckpt"]  # the last checkpoint itself: read once

    other = checkpoint | {"callbacks": {"AttentionMonitor": {"history": later}},
                          "hyper_parameters": checkpoint["hyper_parameters"] | {"network": {"d_model": 8}}}
    torch.save(other, folder / "last.ckpt")  # another run's file: left out
    assert [entry["step"] for entry in run_history(best, checkpoint)[0]] == [10]
    (folder / "last.ckpt").write_bytes(b"broken")
    with pytest.raises(CheckpointError, match="last.ckpt"):
        run_history(best, checkpoint)
