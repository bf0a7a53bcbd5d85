"""Planted bugs (bench/catalogue/bugs.py): each breaks what it claims, planted from outside and undone afterwards;
and the doctor names them in tiny training runs on the synthetic task, while a healthy tiny run gets no warning."""

import json
import math
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

import model.attention as core
from model.classifier import AttentionClassifier
from model.config import NetworkConfig
from model.kinds import ATTENTION_KINDS
from bench.catalogue.bugs import BUGS, Plant, load_bug, replaced, select_bugs
from bench.catalogue.proof import SHIPPED, fit, run_args, subset_files
from bench.catalogue.scores import Run, confusion_table, first_step_table, group_table, summary, verdict_table
from monitor.views import token_window

KINDS = list(ATTENTION_KINDS)
MASKED_KINDS = BUGS["padding-ignored"].kinds  # the kinds whose keys are tokens, which masks reach
LENGTHS = [8, 5, 3]  # a padded batch: the first text fills L, the others end in padding


def forward(bug_name: str | None, kind: str = "full", texts=None):
    """A tiny network of `kind` with the bug planted (None: healthy), run on a padded batch in eval mode.
    Returns (output, padding (B, L) bool, the module the bug edited)."""
    plant = Plant()
    if bug_name is not None:
        BUGS[bug_name].plant(plant)
    config = NetworkConfig(vocab_size=30, max_length=8, d_model=16, n_heads=2, attention=kind, window=2,
                           projection_length=4, dropout=0.0, embedding_dropout=0.0, **plant.settings)
    torch.manual_seed(0)
    network = AttentionClassifier(config).eval()
    module = SimpleNamespace(model=network, online_model=network, hparams=SimpleNamespace(lr=0.001))
    plant.edit(module)
    padding = torch.arange(8) >= torch.tensor(LENGTHS)[:, None]  # (B, L)
    ids = texts if texts is not None else torch.randint(4, 30, (len(LENGTHS), 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), plant.applied():
        output = network(ids, padding, need_weights=True)
    return output, padding, module


def dense(output, module) -> torch.Tensor:
    """The first layer's weights as token × token (B, H, L, L)."""
    return token_window(output.attention[0], 0, 8)


def pad_weight(output, padding, module) -> float:
    """Largest weight a real query puts on the padded keys of its text."""
    weights = dense(output, module)  # (B, H, L, L)
    real_rows = ~padding[:, None, :, None]
    return float((weights * real_rows * padding[:, None, None, :]).sum(-1).max())


def row_sum_error(output, padding, module) -> float:
    """Largest |Σ weights − 1| over the real queries' rows (the sparse kind's global rows included)."""
    return float(((dense(output, module).sum(-1) - 1).abs() * ~padding[:, None]).max())


def future_weight(output, padding, module) -> float:
    """Total weight real queries put on later real keys."""
    later = torch.ones(8, 8, dtype=torch.bool).triu(1)
    real = ~padding
    return float((dense(output, module) * later * real[:, None, :, None] * real[:, None, None, :]).sum())


def real_key_weight(output, padding, module) -> float:
    """Largest total weight a real query of a padded text puts on its real keys."""
    weights = dense(output, module)[1:]  # the padded texts
    return float((weights * ~padding[1:, None, None, :] * ~padding[1:, None, :, None]).sum(-1).max())


def head_difference(output) -> float:
    weights = output.attention[0].weights
    return float((weights - weights[:, :1]).abs().max())


def max_weight(output, padding, module) -> float:
    return float(output.attention[0].weights.amax(-1)[~padding[:, None].expand(-1, 2, -1)].mean())


def shuffled_change(bug_name) -> float:
    """How much the logits move when each text's real tokens are put in reverse order."""
    ids = torch.randint(4, 30, (3, 8), generator=torch.Generator().manual_seed(1))
    reversed_ids = ids.clone()
    for b, n in enumerate(LENGTHS):
        reversed_ids[b, :n] = ids[b, :n].flip(0)
    return float((forward(bug_name, texts=ids)[0].logits - forward(bug_name, texts=reversed_ids)[0].logits).abs().max())


@pytest.mark.parametrize("kind", MASKED_KINDS)
@pytest.mark.parametrize("name", ["padding-ignored", "mask-all-attend", "no-padding-mask"])
def test_padding_bugs_put_weight_on_padding(name, kind):
    assert pad_weight(*forward(None, kind)) == 0.0
    assert pad_weight(*forward(name, kind)) > 0.01


def test_a_mask_on_the_query_axis_lets_real_queries_see_padding():
    assert pad_weight(*forward("mask-on-query-axis")) > 0.01


@pytest.mark.parametrize("kind", MASKED_KINDS)
def test_an_inverted_mask_blocks_every_real_key(kind):
    assert real_key_weight(*forward(None, kind)) == pytest.approx(1.0)
    assert real_key_weight(*forward("mask-inverted", kind)) == 0.0


@pytest.mark.parametrize("kind", MASKED_KINDS)
def test_an_unasked_look_ahead_gives_later_tokens_zero(kind):
    assert future_weight(*forward(None, kind)) > 0.1
    assert future_weight(*forward("look-ahead", kind)) == 0.0


@pytest.mark.parametrize("kind", KINDS)
def test_softmax_over_queries_breaks_the_row_sums(kind):
    assert row_sum_error(*forward(None, kind)) < 1e-5
    assert row_sum_error(*forward("softmax-over-queries", kind)) > 0.1


def test_a_mask_blocking_every_key_leaves_no_weight():
    output, padding, _ = forward("mask-all-blocked")
    assert float(output.attention[0].weights.abs().max()) == 0.0


def test_no_scaling_saturates_and_a_tiny_scale_flattens():
    healthy = max_weight(*forward(None))
    assert max_weight(*forward("no-scaling")) > 0.9 > healthy
    output, padding, _ = forward("tiny-scale")
    weights, allowed = output.attention[0].weights, ~padding[:, None, None, :]
    uniform = allowed / allowed.sum(-1, keepdim=True)
    assert float(((weights - uniform).abs() * ~padding[:, None, :, None]).max()) < 1e-3
    assert healthy > 1 / 8 + 0.05  # the healthy rows are not uniform, so the test above could fail


def test_identical_heads_compute_the_same_weights():
    assert head_difference(forward(None)[0]) > 0.01
    assert head_difference(forward("identical-heads")[0]) == 0.0


def test_dropped_positions_make_the_model_blind_to_order():
    assert shuffled_change(None) > 1e-3
    assert shuffled_change("positions-dropped") < 1e-5


def test_the_learning_rate_bug_multiplies_the_learning_rate():
    assert forward("learning-rate-30x")[2].hparams.lr == pytest.approx(0.03)


def test_outside_bugs_change_the_attention():
    assert row_sum_error(*forward("half-weights")) == pytest.approx(0.5)
    healthy = forward(None)[0].logits
    assert not torch.allclose(forward("noisy-scores")[0].logits, healthy)
    assert not torch.allclose(forward("values-are-keys")[0].logits, healthy)
    assert row_sum_error(*forward("mask-after-softmax")) > 0.01


def test_a_bug_edits_both_networks_of_an_averaging_module():
    config = NetworkConfig(vocab_size=30, max_length=8, d_model=16, n_heads=2)
    networks = [AttentionClassifier(config).eval() for _ in range(2)]  # `model` and `online_model` (ema_decay)
    plant = Plant()
    for name in ("positions-dropped", "no-padding-mask"):
        BUGS[name].plant(plant)
    plant.edit(SimpleNamespace(model=networks[0], online_model=networks[1]))
    ids, padding = torch.randint(4, 30, (3, 8)), torch.arange(8) >= torch.tensor(LENGTHS)[:, None]
    for network in networks:
        assert not network.position_embedding.weight.any()
        assert torch.equal(network(ids, padding).logits, AttentionClassifier.forward(network, ids, None).logits)
        assert not torch.equal(network(ids, padding).logits, AttentionClassifier.forward(network, ids, padding).logits)


def test_linformer_keys_are_virtual_so_padding_bugs_do_not_apply_to_it():
    assert bool((forward(None, "linformer")[0].attention[0].key_positions < 0).all())  # no key is a token
    assert all("linformer" not in BUGS[name].kinds for name in ("padding-ignored", "mask-inverted", "look-ahead"))


def test_planting_is_undone_even_when_the_run_fails():
    original = core.attention
    with pytest.raises(RuntimeError), replaced([(original, lambda *a, **k: None)]):
        assert core.attention is not original and sys.modules["model.attention"].attention is not original
        raise RuntimeError("the run broke")
    assert core.attention is original


def test_a_users_bug_loads_from_their_module(tmp_path, monkeypatch):
    (tmp_path / "my_bugs.py").write_text(textwrap.dedent('''
        from bench.catalogue.bugs import bug

        @bug(expects="padding-leak")
        def my_bug(plant):
            "Every key visible."
            plant.layers(lambda layer: setattr(layer, "mask", lambda padding, L, device=None: None))

        def plain(plant):
            plant.network(d_head=4)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    mine = load_bug("my_bugs:my_bug")
    assert (mine.name, mine.expects, mine.summary) == ("my-bug", ("padding-leak",), "Every key visible.")
    assert load_bug("my_bugs:plain").expects == ()  # any warning counts
    BUGS.pop("my-bug")
    for spec, message in (("nope", "no such bug"), ("my_bugs:missing", "cannot load"), ("no_module_here:x", "cannot load")):
        with pytest.raises(ValueError, match=message):
            load_bug(spec)
    assert [b.name for b in select_bugs(["field"])] == [b.name for b in BUGS.values() if b.group == "field"]


def test_the_bench_counts_what_each_run_was_told():
    def told(step, *warnings):
        return {"step": step, "warnings": list(warnings), "notes": []}

    runs = [Run("padding-ignored", "sst2", "sst2.yaml", [told(23), told(46, "padding-leak")]),
            Run("padding-ignored", "synthetic", "smoke.yaml", [told(23, "rows-not-normalized")]),
            Run("values-are-keys", "sst2", "sst2.yaml", [told(23)]),
            Run("healthy", "sst2", "no config", [told(23), told(46, "saturated")])]
    assert runs[0].first_step(("padding-leak",)) == 46 and runs[1].first_step(("padding-leak",)) is None
    assert summary(runs) == {"catalogued_runs": 2, "named_by_end_of_epoch_1": 1, "named_within_200_steps": 1,
                             "outside_runs": 1, "outside_runs_warned": 0, "held_out_runs": 0,
                             "held_out_runs_warned": 0, "healthy_runs": 1, "healthy_runs_with_warnings": 1}
    assert group_table(runs)[2:] == ["| runs | 2 | 1 | 1 |", "| any warning | 2 of 2 | 0 of 1 | 1 of 1 (false alarms) |",
                                     "| expected verdict | 1 of 2 | – | – |"]
    assert "| padding-leak | 2 | 0.50 | 1 | 0 | 1.00 |" in verdict_table(runs)
    assert "| saturated | 0 | – | 0 | 1 | 0.00 |" in verdict_table(runs)
    table = confusion_table(runs)
    assert table[0] == "| planted bug | padding-leak | rows-not-normalized | none |"
    assert table[2:] == ["| padding-ignored (2) | 1 | 1 | · |", "| values-are-keys (1) | · | · | 1 |"]
    assert first_step_table(runs)[2:] == ["| padding-ignored | padding-leak | 46 | not seen (+rows-not-normalized) |",
                                          "| values-are-keys | any warning | not seen | n/a |"]


# ---- the doctor on tiny training runs ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return subset_files("synthetic", 400, tmp_path_factory.mktemp("planted") / "data", validation_rows=100)


def tiny_run(tiny_data, tmp_path, bug_name):
    args = run_args(SHIPPED["synthetic"], *tiny_data, tmp_path, tmp_path / "cache")
    checks, accuracy, error = fit(args, BUGS[bug_name] if bug_name else None, check_every=2)
    assert checks and error is None and not math.isnan(accuracy)
    return {name for check in checks for name in check["warnings"]}


@pytest.mark.slow
@pytest.mark.parametrize("name, verdict", [  # a figure of attention, and each contract check, in training
    ("padding-ignored", "padding-leak"),
    ("values-are-keys", "formula-broken"),
    ("values-detached", "weight-not-learning"),
    ("pooling-over-padding", "invariance-broken"),
    ("scale-setting", "formula-setting"),
    ("norm-before-attention", "block-broken"),
    ("head-learning-rate", "optimizer-setting"),
])
def test_the_doctor_names_a_planted_bug(tiny_data, tmp_path, name, verdict):
    assert verdict in tiny_run(tiny_data, tmp_path, name)


@pytest.mark.slow
def test_a_healthy_tiny_run_gets_no_warning(tiny_data, tmp_path):
    assert tiny_run(tiny_data, tmp_path, None) == set()


def test_a_users_bug_that_cannot_load_or_raises_is_one_line_and_the_bench_goes_on(tmp_path, monkeypatch, caplog):
    import bench.catalogue.proof as proof
    from bench.catalogue.bugs import Bug

    (tmp_path / "broken_bugs.py").write_text("def broken(plant):\n    return (\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level("ERROR", logger="bench.catalogue.bugs"):
        assert [b.name for b in select_bugs(["broken_bugs:broken", "padding-ignored"])] == ["padding-ignored"]
    (record,) = caplog.records
    assert "broken_bugs:broken" in record.getMessage() and "SyntaxError" in record.getMessage()
    with pytest.raises(ValueError, match="no such bug"):  # a misspelt catalogue name still stops it before it starts
        select_bugs(["padding-ignord"])

    def raising(plant):
        raise RuntimeError("my bug is broken")
    monkeypatch.setattr(proof, "subset_files", lambda *a, **k: (tmp_path / "t.csv", tmp_path / "v.csv"))
    monkeypatch.setattr(proof, "fit", lambda args, bug, every: (bug.plant(Plant()) if bug else None) or (
        [{"step": 1, "warnings": [], "notes": []}], 0.5, None))
    caplog.clear()
    with caplog.at_level("ERROR", logger="bench.catalogue.proof"):
        runs = proof.measure([Bug("mine", raising, group="outside"), None], ["synthetic"], 10, tmp_path, 1)
    assert [run.bug for run in runs] == ["healthy", "healthy"]  # the shipped config's and the no-config run
    assert "my bug is broken" in caplog.records[0].getMessage()


def test_every_bug_and_each_group_includes_the_held_out_bugs():
    every = [b.name for b in select_bugs(["all"])]
    held_out = [b.name for b in select_bugs(["heldout"])]
    assert "padding-ignored" in every and "residual-dropped" in every and "residual-dropped" in held_out
    assert set(held_out) <= set(every) and "padding-ignored" not in held_out


def test_the_bench_reads_verdicts_of_another_version_as_notes():
    from bench.catalogue.proof import check

    told = check(7, [{"verdict": "a-verdict-of-tomorrow"}, {"verdict": "padding-leak", "layer": 0, "head": None,
                                                            "figures": {}}])
    assert told == {"step": 7, "warnings": ["padding-leak"], "notes": ["a-verdict-of-tomorrow"]}


def test_the_confusion_table_is_valid_markdown_when_no_warning_was_given():
    table = confusion_table([Run("padding-ignored", "sst2", "sst2.yaml", [{"step": 1, "warnings": [], "notes": []}])])
    assert len({line.count("|") for line in table}) == 1, table


@pytest.mark.slow
def test_a_healthy_checkpoint_of_another_version_is_read_and_a_broken_one_left_out_in_one_line(tiny_checkpoint,
                                                                                              tmp_path, capsys, caplog):
    from bench.diagnosis import main

    checkpoint = torch.load(tiny_checkpoint, weights_only=True)
    history = [{"step": 3, "epoch": 0, "findings": [{"verdict": "a-verdict-of-tomorrow"}]}]
    torch.save(checkpoint | {"callbacks": {"AttentionMonitor": {"history": history}}}, tiny_checkpoint)
    broken = tmp_path / "broken.ckpt"
    torch.save(checkpoint | {"callbacks": {"AttentionMonitor": {"history": [{"findings": 3}]}}}, broken)
    main(["--bugs", "none", "--no-healthy", "--work", str(tmp_path / "work"),
          "--healthy-checkpoints", str(tiny_checkpoint), str(broken)])
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["healthy_runs"] == 1
    (line,) = [r.getMessage() for r in caplog.records if str(broken) in r.getMessage()]
    assert "left out" in line and "history" in line and "\n" not in line


# ---- the doctor on every bug of the catalogue, one validation's checks on a tiny network --------------------------


def one_validation(bug_name: str, kind: str) -> set[str]:
    """The warnings of one validation's checks (health figures, model checks, contract checks, the dynamics of a
    few steps of the module's own optimizer) on a tiny network with the bug planted."""
    from monitor.checks import model_checks
    from monitor.contract import contract_checks, formula_settings, optimizer_differences
    from monitor.doctor import diagnose, warnings
    from monitor.dynamics import TrainingDynamics
    from monitor.health import AttentionHealth
    from training.module import ClassifierModule

    plant = Plant()
    BUGS[bug_name].plant(plant)
    config = NetworkConfig(**({"vocab_size": 30, "max_length": 16, "d_model": 16, "n_heads": 2, "attention": kind,
                                "window": 2, "projection_length": 4, "dropout": 0.0, "embedding_dropout": 0.0}
                               | plant.settings))
    torch.manual_seed(0)
    module = ClassifierModule(network=config, lr=0.001)
    network = module.model
    plant.edit(module)
    lengths = torch.tensor([12, 9, 7, 5, 3, 10, 8, 2])
    padding = torch.arange(12) >= lengths[:, None]
    ids = torch.randint(4, 30, (8, 12), generator=torch.Generator().manual_seed(1)).masked_fill(padding, 0)
    batch = {"input_ids": ids, "padding_mask": padding, "labels": torch.arange(8) % 2}
    with plant.applied():
        module._trainer = SimpleNamespace(estimated_stepping_batches=20)  # configure_optimizers' schedule length
        optimizer = module.configure_optimizers()["optimizer"]
        module._trainer.optimizers = [optimizer]
        dynamics = TrainingDynamics()
        dynamics.watch(module)
        for step in range(3):
            loss = torch.nn.functional.cross_entropy(network(ids, padding).logits, batch["labels"])
            optimizer.zero_grad()
            loss.backward()
            dynamics.gradients()
            optimizer.step()
            dynamics.update({"loss": loss.detach()}, step + 1, 8)
        network.eval()
        health = AttentionHealth(causal=config.causal)
        with torch.no_grad():
            health.update(network(ids, padding, need_weights=True).attention, padding)
        checks = model_checks(network, [batch]) | contract_checks(network, [batch]) | formula_settings(config)
        checks["optimizer"] = optimizer_differences(*module.configured_optimizer()[:1], [optimizer],
                                                    module.configured_optimizer()[1])
        findings = diagnose(health.compute(), checks, dynamics.summary(), config)
    return {finding.verdict for finding in warnings(findings)}


# The bench measures the held-out group; no test asserts on it (a test that must pass is a threshold tuned to it).
@pytest.mark.parametrize("name, kind", [(name, kind) for name, entry in BUGS.items() if entry.group != "heldout"
                                        for kind in entry.kinds])
def test_the_doctor_names_each_bug_at_one_validation(name, kind):
    expected, given = BUGS[name].expects, one_validation(name, kind)
    assert (set(expected) & given) if expected else given, f"{name} on {kind}: {sorted(given)}"
