"""The doctor's checks as units (monitor/units.py): one object registered once reaches the monitor's findings,
diagnose.py's report and the docs' verdict table; one runner serves both."""

import math

import pytest
import torch

from monitor.doctor import VERDICTS, Finding, Verdict, warnings
from monitor.units import CHECKS, SUBJECT_FIELDS, Check, Subject, examine, register, unregister, \
    verdict_reference_markdown

SAID = Verdict("warning", "the test's own check ran on a model and its sample", "a test registered it",
               "unregister it")


def texts_counted(subject, measured):
    """A check of the kind a user adds: reads the model and the sample, measures a figure, gives a warning."""
    texts = sum(len(batch["labels"]) for batch in subject.sample)
    return {"texts_seen": texts}, [Finding("unit-test-said-so", None, None, {"texts_seen": texts})]


@pytest.fixture
def own_check():
    check = register(Check("unit-test", ("model", "sample"), texts_counted, {"unit-test-said-so": SAID},
                           figures=("texts_seen",), summary="counts the texts it is given"))
    yield check
    unregister("unit-test")


def tiny_subject(**fields):
    from model.classifier import AttentionClassifier
    from model.config import NetworkConfig

    config = NetworkConfig(vocab_size=30, max_length=8, d_model=16, n_heads=2, dropout=0.0, embedding_dropout=0.0)
    torch.manual_seed(0)
    model = AttentionClassifier(config).eval()
    padding = torch.arange(8) >= torch.tensor([8, 5, 3])[:, None]
    ids = torch.randint(4, 30, (3, 8), generator=torch.Generator().manual_seed(1)).masked_fill(padding, 0)
    batch = {"input_ids": ids, "padding_mask": padding, "labels": torch.tensor([0, 1, 1])}
    return Subject(model=model, sample=[batch], config=config, **fields)


def test_every_verdict_is_given_by_a_registered_check_and_every_check_reads_subject_fields():
    given = {name for check in CHECKS.values() for name in check.verdicts}
    assert set(VERDICTS) == given
    assert all(set(check.reads) <= set(SUBJECT_FIELDS) for check in CHECKS.values())
    with pytest.raises(ValueError, match="not a Subject field"):
        Check("bad", ("weights",), texts_counted)


def test_the_checks_of_one_layer_are_the_one_check_type_each_carrying_its_verdicts():
    from monitor.layer_contract import CHECKS as LAYER_CHECKS

    assert LAYER_CHECKS and all(isinstance(check, Check) and CHECKS[check.name] is check for check in LAYER_CHECKS)
    for check in LAYER_CHECKS:  # its FAIL verdict named from its own name, with the rule it FAILs by
        assert check.verdicts[f"attention-{check.name}"].rule.startswith(f"{check.name} FAILs when")
        assert VERDICTS[f"attention-{check.name}"] is check.verdicts[f"attention-{check.name}"]


def test_a_registered_check_runs_where_its_fields_are_and_is_in_the_docs_table(own_check):
    measured, findings = examine(tiny_subject())
    assert measured["unit-test"] == {"texts_seen": 3}
    assert [f.verdict for f in warnings(findings)] == ["unit-test-said-so"]
    assert "formula" in measured["contract"] and "head_loss_delta" in measured["model-checks"]  # the built-ins too
    _, without_model = examine(Subject(config=tiny_subject().config))
    assert not without_model  # no model, no sample: neither the test's check nor the model checks run
    assert "| `unit-test-said-so` | unit-test (model, sample) | warning |" in verdict_reference_markdown()
    assert VERDICTS["unit-test-said-so"] is SAID and "texts_seen 3" in findings[0].line()


def test_unregistering_a_check_takes_its_verdicts_out_and_a_clash_is_refused(own_check):
    with pytest.raises(ValueError, match="defined otherwise"):
        register(Check("other", ("model",), texts_counted,
                       {"unit-test-said-so": Verdict("note", "another rule", "", "")}))
    unregister("unit-test")
    assert "unit-test-said-so" not in VERDICTS and "unit-test-said-so" not in verdict_reference_markdown()
    register(own_check)  # for the fixture's own unregister


def test_a_check_of_one_layer_alone_runs_on_a_layer_subject():
    from model.attention import MultiHeadSelfAttention

    from monitor.layer_probe import Probe

    def width(subject, measured):
        return {"d_model": float(subject.layer.layer.w_q.in_features)}, []

    register(Check("layer-width", ("layer",), width))
    try:
        layer = next(iter(tiny_subject().model.blocks)).attention
        measured, findings = examine(Subject(layer=Probe(layer)))
        assert measured["layer-width"] == {"d_model": 16.0}
        assert not {"model-checks", "contract", "settings", "verdicts"} & set(measured)  # the model's did not run
        assert all(check.reads == ("layer",) for name, check in CHECKS.items() if name in measured)
        assert isinstance(layer, MultiHeadSelfAttention)
    finally:
        unregister("layer-width")


@pytest.mark.slow
def test_a_registered_check_reaches_the_monitor_and_diagnose(own_check, tiny_checkpoint, tmp_path):
    from bench.catalogue.proof import SHIPPED, fit, run_args, subset_files
    from inference.diagnosis import diagnose_checkpoint, text_report

    data = subset_files("synthetic", 200, tmp_path / "data", validation_rows=50)
    checks, accuracy, error = fit(run_args(SHIPPED["synthetic"], *data, tmp_path, tmp_path / "cache"))
    assert error is None and not math.isnan(accuracy)
    assert all("unit-test-said-so" in check["warnings"] for check in checks)  # every validation of the monitor

    diagnosis = diagnose_checkpoint(tiny_checkpoint, texts=20)
    assert "unit-test-said-so" in {f.verdict for f in diagnosis.warnings}
    assert "unit-test-said-so (texts_seen 20)" in text_report(diagnosis)
