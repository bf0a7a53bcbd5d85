"""The doctor's checks as units: each one `Check` (its name, what it reads, its figures, the verdicts it gives with
their rule, likely cause and what to try), registered once in CHECKS, run by one runner, `examine`, for the
AttentionMonitor (monitor/callback.py), `diagnose.py --ckpt` (inference/diagnosis.py) and `diagnose.py --attention`
(monitor/layer_contract.py, whose checks of one layer alone are Checks too, made by monitor/layer_probe.py's
layer_check). docs/DOCTOR.md's verdict table is made from the registry (verdict_reference_markdown).

A check reads a Subject, the thing examined, and runs when every field it `reads` is there:

    model, sample   a classifier and a validation sample of its batches (input_ids, padding_mask, labels)
    figures         the health figures of what its layers computed over a validation pass (monitor/health.py)
    dynamics        the training figures since the last validation (monitor/dynamics.py; absent without training)
    layer           one attention layer alone with its seeded probe inputs (monitor/layer_probe.Probe; the
                    checks of monitor/layer_contract.py, diagnose.py --attention)
    config          the network's settings (NetworkConfig)

Your own check, in your own module (imported before the run; registering it twice replaces it):

    from monitor.doctor import Finding, Verdict
    from monitor.units import Check, register

    def wide_scores(subject, measured):
        spread = max(float(s.std()) for s in scores_of(subject.model, subject.sample))
        return {"score_spread": spread}, [Finding("scores-wide", None, None, {"score_spread": spread})] * (spread > 50)

    register(Check("score-spread", reads=("model", "sample"), run=wide_scores, figures=("score_spread",),
                   verdicts={"scores-wide": Verdict("warning", "score_spread > 50", "…", "…")}))

Its findings then reach the monitor's warnings, TensorBoard and the checkpoint's history, diagnose.py's report and exit
status, and its verdicts the docs' table.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from monitor.doctor import VERDICTS, Finding, Verdict, diagnose
from monitor.verdict_table import CONTRACT_VERDICTS, MODEL_CHECK_VERDICTS, RULE_VERDICTS, SETTING_VERDICTS

SUBJECT_FIELDS = ("model", "sample", "figures", "dynamics", "layer", "config")


@dataclass
class Subject:
    """What the checks read; a field left None is not there (its checks do not run)."""

    model: object = None  # a classifier: model(input_ids, padding_mask).logits, model.blocks, model.config
    sample: list[dict] | None = None  # validation batches for the checks that run the model again
    figures: object = None  # monitor.health.HealthFigures of a validation pass
    dynamics: dict | None = None  # monitor.dynamics summary, with epoch, step, balanced accuracy (training only)
    layer: object = None  # one attention layer alone: a monitor.layer_probe.Probe
    config: object = None  # the NetworkConfig (positions, kind, causal), when there is one
    batches: list[dict] | None = None  # every validation batch read (the contract's invariances); else `sample`
    measured: dict = field(default_factory=dict)  # figures measured outside the checks (the optimizer's groups)


@dataclass(frozen=True)
class Check:
    """One check of the doctor: the one type every check is, whatever it reads."""

    name: str
    reads: tuple[str, ...]  # Subject fields it needs (SUBJECT_FIELDS)
    run: Callable[[Subject, dict], tuple[dict, list[Finding]]]  # (subject, figures of the checks before) → (its
    # figures, its findings)
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # the verdicts it gives, each named once (its own,
    # or one shared with other checks: the same Verdict)
    figures: tuple[str, ...] = ()  # the figures it measures, as its findings name them
    summary: str = ""  # one line: what it checks

    def __post_init__(self):
        unknown = set(self.reads) - set(SUBJECT_FIELDS)
        if unknown:
            raise ValueError(f"check {self.name}: reads {sorted(unknown)}, not a Subject field ({SUBJECT_FIELDS})")


CHECKS: dict[str, Check] = {}


def register(check: Check) -> Check:
    """Adds the check (replacing one of its name) and its verdicts to the verdict table; a verdict another check
    gives already must be the same Verdict."""
    for name, verdict in check.verdicts.items():
        if VERDICTS.get(name, verdict) != verdict:
            raise ValueError(f"check {check.name}: verdict {name} is defined otherwise already")
        VERDICTS[name] = verdict
    CHECKS[check.name] = check
    return check


def unregister(name: str) -> None:
    """Removes a check and the verdicts only it gives (a test's own check, afterwards)."""
    check = CHECKS.pop(name)
    given = {verdict for other in CHECKS.values() for verdict in other.verdicts}
    for verdict in check.verdicts:
        if verdict not in given:
            VERDICTS.pop(verdict, None)


def examine(subject: Subject) -> tuple[dict, list[Finding]]:
    """Every registered check whose fields the subject has, in registration order; returns (its figures by check
    name, the findings, warnings first). A check is handed the figures the checks before it measured (the verdicts
    of the built-in doctor read the model checks' and the contract's together)."""
    figures, findings = {}, []
    for check in CHECKS.values():
        if any(getattr(subject, name) is None for name in check.reads):
            continue
        measured, found = check.run(subject, figures)
        figures[check.name] = measured
        findings += found
    return figures, sorted(findings, key=lambda f: f.severity != "warning")


def verdict_reference_markdown() -> str:
    """The verdict table of docs/DOCTOR.md, made from the registry: each check's verdicts (a verdict once, under the
    first check that gives it), with what the check reads (`make docs` writes it into docs/DOCTOR.md)."""
    lines = ["| verdict | check (reads) | severity | rule | likely cause | what to try |", "|---|---|---|---|---|---|"]
    shown = set()
    for check in CHECKS.values():
        reads = ", ".join(check.reads)
        for name, v in check.verdicts.items():
            if name not in shown:
                shown.add(name)
                lines.append(f"| `{name}` | {check.name} ({reads}) | {v.severity} | {v.rule} | {v.cause} | {v.fix} |")
    return "\n".join(lines)


# ---- the built-in doctor's checks -----------------------------------------------------------------------------------


def _model_checks(subject, measured):
    from monitor.checks import model_checks

    return model_checks(subject.model, subject.sample), []


def _contract(subject, measured):
    from monitor.contract import contract_checks

    return contract_checks(subject.model, subject.batches or subject.sample), []


def _settings(subject, measured):
    from monitor.contract import formula_settings

    return formula_settings(subject.config) | subject.measured, []


def _verdicts(subject, measured):
    """The doctor's verdicts on the figures of the checks above and the health figures (monitor/doctor.py)."""
    checks = {name: value for check in ("model-checks", "contract", "settings") for name, value in
              measured.get(check, {}).items()}
    return {}, diagnose(subject.figures, checks, subject.dynamics, subject.config)


register(Check("model-checks", ("model", "sample"), _model_checks, MODEL_CHECK_VERDICTS, summary="heads zeroed one "
               "at a time, tokens shuffled, positions zeroed, a second identical pass, the heads' weight slices "
               "(monitor/checks.py)", figures=("head_loss_delta", "order_sensitivity", "position_sensitivity",
                                               "unsteady_loss", "weight_similarity")))
register(Check("contract", ("model", "sample"), _contract, CONTRACT_VERDICTS, summary="each layer and block "
               "recomputed from its own input and weights by its definition; weights shared; invariances "
               "(monitor/contract.py)", figures=("formula", "blocks", "shared", "invariance")))
register(Check("settings", ("config",), _settings, SETTING_VERDICTS, summary="the settings that change the formula; "
               "the optimizer's parameter groups against the configured ones", figures=("scale_factor", "optimizer")))
register(Check("verdicts", ("figures",), _verdicts, RULE_VERDICTS, summary="the doctor's rules on the health figures, "
               "the figures above and the training dynamics (monitor/doctor.py)"))
