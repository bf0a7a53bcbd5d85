"""The proof's scores: what each run of a planted bug (or a healthy run) was told, counted by bug, by group and
by verdict. bench/diagnosis.py makes the runs and prints these tables; docs/DOCTOR.md publishes them.

    Run                  one run: the bug planted ("healthy" for none), the verdicts of each validation
    summary(runs)        catalogued bugs named with their cause, bugs outside the catalogue warned, false alarms
    report(runs, ...)    every table below, as docs/DOCTOR.md shows them
    class_summary(...)   the user-written classes judged by the layer contract (docs/OWN_ATTENTION.md)
"""

import math
import os
from dataclasses import dataclass, field

from bench.catalogue.bugs import GROUPS, Bug, every_bug, load_bug
from monitor.doctor import VERDICTS

NO_CONFIG = "no config"
HELD_OUT = "heldout"  # the group of bugs written by someone who never read monitor/ (bench/catalogue/bugs_heldout.py)
FIRST_STEPS = 200  # the goal: each verdict within this many optimizer steps


@dataclass
class Run:
    """One training run and what the doctor said at each validation."""

    bug: str  # "healthy" for no bug
    dataset: str
    config: str  # a config file's name, or NO_CONFIG
    checks: list[dict] = field(default_factory=list)  # {"step", "warnings": [verdict, ...], "notes": [...]}
    accuracy: float = math.nan  # validation accuracy at the end
    seconds: float = 0.0
    error: str | None = None  # the product stopped the run (a non-finite loss), with its message

    def warnings(self) -> set[str]:
        return {name for check in self.checks for name in check["warnings"]}

    def first_step(self, verdicts: tuple[str, ...]) -> int | None:
        """The step of the first validation that gave one of `verdicts` (any warning when empty); None if none did."""
        for check in self.checks:
            if any(name in verdicts for name in check["warnings"]) or (not verdicts and check["warnings"]):
                return check["step"]
        return None


# ---- tables -------------------------------------------------------------------------------------------------------


def first_step_table(runs: list[Run]) -> list[str]:
    """Planted bug × dataset: the optimizer step of the first validation that gave the expected verdict (any warning
    for a bug outside the catalogue; "not seen": none did), then in brackets the other warnings the run was given."""
    planted = [run for run in runs if run.bug != "healthy"]
    datasets = list(dict.fromkeys(run.dataset for run in planted))
    lines = [f"| bug | expected | {' | '.join(datasets)} |", "|---|---|" + "---:|" * len(datasets)]
    for name in dict.fromkeys(run.bug for run in planted):
        bug = bug_of(next(run for run in planted if run.bug == name))
        cells = []
        for dataset in datasets:
            mine = [run for run in planted if run.bug == name and run.dataset == dataset]
            cells.append("n/a" if not mine else " ".join(told(run, bug) for run in mine))
        lines.append(f"| {name} | {' or '.join(bug.expects) or 'any warning'} | {' | '.join(cells)} |")
    return lines


def told(run: Run, bug: Bug) -> str:
    step = run.first_step(bug.expects)
    others = ", ".join(sorted(run.warnings() - set(bug.expects)))  # for a bug outside the catalogue: all it was told
    return ("not seen" if step is None else str(step)) + (f" ({'+' * bool(bug.expects)}{others})" if others else "") + (
        " (stopped: non-finite loss)" if run.error else "")


def accuracy(run: Run) -> str:
    return "–" if math.isnan(run.accuracy) else f"{run.accuracy:.3f}"


def confusion_table(runs: list[Run]) -> list[str]:
    """Planted bug (its number of runs) × warning: in how many of the bug's runs each warning was given at any
    validation; "none": runs with no warning at all."""
    planted = [run for run in runs if run.bug != "healthy"]
    columns = sorted({name for run in planted for name in run.warnings()})
    lines = ["| " + " | ".join(["planted bug", *columns, "none"]) + " |", "|---|" + "---:|" * (len(columns) + 1)]
    for name in dict.fromkeys(run.bug for run in planted):
        mine = [run for run in planted if run.bug == name]
        counts = [sum(column in run.warnings() for run in mine) for column in columns]
        counts.append(sum(not run.warnings() for run in mine))
        lines.append(f"| {name} ({len(mine)}) | {' | '.join(str(n) if n else '·' for n in counts)} |")
    return lines


def healthy_table(runs: list[Run]) -> list[str]:
    lines = ["| dataset | config | validations | warnings (at steps) | notes | val acc |",
             "|---|---|---:|---|---|---:|"]
    for run in runs:
        if run.bug != "healthy":
            continue
        given = {}
        for check in run.checks:
            for name in check["warnings"]:
                given.setdefault(name, []).append(check["step"])
        notes = sorted({n for check in run.checks for n in check["notes"]})
        warned = "; ".join(f"{name} ({', '.join(map(str, steps))})" for name, steps in given.items()) or "none"
        lines.append(f"| {run.dataset} | {run.config} | {len(run.checks)} | {warned} | {', '.join(notes) or '–'} | "
                     f"{accuracy(run)} |")
    return lines


def group_table(runs: list[Run]) -> list[str]:
    """One column per bug group (catalogue, field, contract, heldout, outside) and the healthy runs: runs, runs given
    any warning, runs given the bug's expected verdict (its cause named; "–" for bugs that expect any warning)."""
    groups = [g for g in GROUPS if any(run.bug != "healthy" and bug_of(run).group == g for run in runs)]
    healthy = [run for run in runs if run.bug == "healthy"]
    lines = [f"| | {' | '.join(groups)} | healthy |", "|---|" + "---:|" * (len(groups) + 1)]
    rows = {"runs": [], "any warning": [], "expected verdict": []}
    for group in groups:
        mine = [(run, bug_of(run)) for run in runs if run.bug != "healthy" and bug_of(run).group == group]
        named = [run for run, bug in mine if bug.expects]
        rows["runs"].append(str(len(mine)))
        rows["any warning"].append(f"{sum(bool(run.warnings()) for run, _ in mine)} of {len(mine)}")
        hits = sum(run.first_step(bug_of(run).expects) is not None for run in named)
        rows["expected verdict"].append(f"{hits} of {len(named)}" if named else "–")
    cells = {"runs": str(len(healthy)), "any warning": f"{sum(bool(run.warnings()) for run in healthy)} of "
             f"{len(healthy)} (false alarms)", "expected verdict": "–"}
    return lines + [f"| {name} | {' | '.join(values)} | {cells[name]} |" for name, values in rows.items()]


def verdict_table(runs: list[Run]) -> list[str]:
    """Per warning verdict: recall (the runs of bugs that expect it that were given it) and precision (of the runs
    given it, the share that had a bug planted: a healthy run given it is a false alarm)."""
    planted = [(run, bug_of(run)) for run in runs if run.bug != "healthy"]
    healthy = [run for run in runs if run.bug == "healthy"]
    lines = ["| verdict | expected in runs | recall | given in bug runs | given in healthy runs | precision |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, verdict in VERDICTS.items():
        if verdict.severity != "warning":
            continue
        expected = [run for run, bug in planted if name in bug.expects]
        hit = sum(name in run.warnings() for run in expected)
        given_bug = sum(name in run.warnings() for run, _ in planted)
        given_healthy = sum(name in run.warnings() for run in healthy)
        if not expected and not given_bug and not given_healthy:
            continue
        recall = f"{hit / len(expected):.2f}" if expected else "–"
        given = given_bug + given_healthy
        precision = f"{given_bug / given:.2f}" if given else "–"
        lines.append(f"| {name} | {len(expected)} | {recall} | {given_bug} | {given_healthy} | {precision} |")
    return lines


def summary(runs: list[Run]) -> dict:
    """Catalogued bugs (groups catalogue, field and contract) named with their cause, bugs outside the catalogue
    (outside, and the held-out ones, written without reading the doctor) given any warning, healthy runs given one."""
    planted = [(run, bug_of(run)) for run in runs if run.bug != "healthy"]
    designed = [(run, bug) for run, bug in planted if bug.group not in ("outside", HELD_OUT)]
    held_out = [run for run, bug in planted if bug.group == HELD_OUT]
    named = [run.first_step(bug.expects) for run, bug in designed]
    healthy = [run for run in runs if run.bug == "healthy"]
    return {
        "catalogued_runs": len(designed),
        "named_by_end_of_epoch_1": sum(step is not None for step in named),
        f"named_within_{FIRST_STEPS}_steps": sum(step is not None and step <= FIRST_STEPS for step in named),
        "outside_runs": len(planted) - len(designed) - len(held_out),
        "outside_runs_warned": sum(bool(run.warnings()) for run, bug in planted if bug.group == "outside"),
        "held_out_runs": len(held_out),
        "held_out_runs_warned": sum(bool(run.warnings()) for run in held_out),
        "healthy_runs": len(healthy),
        "healthy_runs_with_warnings": sum(bool(run.warnings()) for run in healthy),
    }


def bug_of(run: Run) -> Bug:
    return every_bug().get(run.bug) or load_bug(run.bug)


def report(runs: list[Run], command: str, failed: list | None = None) -> str:
    """The tables; `failed` (bugs that did not load or raised, checkpoints that failed) listed first."""
    figures = summary(runs)
    parts = [command, "",
             f"Catalogued bugs named with their cause by the end of the first epoch: "
             f"{figures['named_by_end_of_epoch_1']} of {figures['catalogued_runs']} runs; within {FIRST_STEPS} steps: "
             f"{figures[f'named_within_{FIRST_STEPS}_steps']}. Bugs outside the catalogue given a warning: "
             f"{figures['outside_runs_warned']} of {figures['outside_runs']} runs. Held-out bugs given a warning: "
             f"{figures['held_out_runs_warned']} of {figures['held_out_runs']} runs. Healthy runs with a warning: "
             f"{figures['healthy_runs_with_warnings']} of {figures['healthy_runs']}.", ""]
    if failed:
        parts += ["Left out, the bench's exit status 1:", "",
                  *[f"- {f['bug']}{' on ' + f['dataset'] if f['dataset'] else ''}: {f['error']}" for f in failed], ""]
    parts += ["Runs by group:", "", *group_table(runs), "", "Per verdict:", "", *verdict_table(runs), ""]
    if figures["catalogued_runs"] + figures["outside_runs"]:
        parts += ["First step at which the expected verdict was given (other warnings in brackets):", "",
                  *first_step_table(runs), "", "Confusion: planted bug (runs) × warning given at any "
                  "validation (runs):", "", *confusion_table(runs), ""]
    if figures["healthy_runs"]:
        parts += ["Healthy runs:", "", *healthy_table(runs), ""]
    return "\n".join(parts)


# ---- user-written classes through the layer contract -----------------------------------------------------------


def class_summary(results: list[dict]) -> dict:
    """User-written classes judged (proof.judge): buggy ones that FAIL, with a check naming their mistake; correct
    ones that FAIL (false alarms); bad-input errors; seconds per class."""
    buggy = [r for r in results if not r["correct"]]
    correct = [r for r in results if r["correct"]]
    return {"buggy": len(buggy), "buggy_failed": sum(bool(r["failed"]) for r in buggy),
            "buggy_right_check": sum(bool(r["right"]) for r in buggy), "correct": len(correct),
            "correct_failed": sum(bool(r["failed"]) for r in correct),
            "errors": sum(bool(r["error"]) for r in results),
            "seconds_max": max(r["seconds"] for r in results),
            "seconds_mean": sum(r["seconds"] for r in results) / len(results)}


def class_report(results: list[dict], totals: dict) -> str:
    lines = ["| class | correct | expected | FAIL | right check | s |", "|---|---|---|---|---|---|"]
    for r in results:
        failed = ", ".join(r["failed"]) or ("error: " + r["error"] if r["error"] else "none")
        right = "n/a" if r["correct"] else ("yes: " + ", ".join(r["right"]) if r["right"] else "**no**")
        lines.append(f"| {r['class']} | {'yes' if r['correct'] else 'no'} | {', '.join(r['expected'])} | {failed} "
                     f"| {right} | {r['seconds']:.1f} |")
    recall = totals["buggy_right_check"] / max(totals["buggy"], 1)
    lines += ["", f"buggy classes FAILing with a right check: {totals['buggy_right_check']}/{totals['buggy']} "
              f"({recall:.0%}); FAILing at all: {totals['buggy_failed']}/{totals['buggy']}",
              f"correct classes with a FAIL: {totals['correct_failed']}/{totals['correct']}",
              f"bad-input errors: {totals['errors']}; seconds per class: mean {totals['seconds_mean']:.1f}, "
              f"max {totals['seconds_max']:.1f} (load {os.getloadavg()[0]:.1f})"]
    return "\n".join(lines)
