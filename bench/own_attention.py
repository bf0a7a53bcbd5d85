"""The attention contract (`diagnose.py --attention`) on user-written classes it never saw: the catalogue of
monitor/catalogue/user_attention/, correct and buggy, written by someone who had not read the checks. Per class its
verdicts, whether it FAILs and with which checks, and whether a FAIL names the property the class's mistake breaks;
then recall (buggy classes that FAIL with a right check / buggy classes), the FAILs on correct classes, the runtime.

    python -m bench.own_attention                      # in this process, each class built as diagnose.py builds it
    python -m bench.own_attention --command            # each class through `python diagnose.py --attention` (timed)
    python -m bench.own_attention --d-model 32 --heads 4

The catalogue names properties of attention (its CATEGORIES), not the checks; monitor/catalogue/proof.py's RIGHT
says which categories each check's FAIL is evidence of. Nothing here sets a threshold: the checks are those of
monitor/layer_contract.py as they are.
"""

import argparse
import json
import logging
import os
import subprocess
import sys
import time

from bench.common import ROOT
from monitor.catalogue.proof import RIGHT, USER_CLASSES, judge, judged
from monitor.catalogue.user_attention.catalogue import CATALOGUE


def judge_command(entry: dict, d_model: int, heads: int) -> dict:
    """One class through `python diagnose.py --attention` in its own process (what a user runs, timed)."""
    argv = [sys.executable, "diagnose.py", "--attention", f"{USER_CLASSES / entry['file']}:{entry['class_name']}",
            "--d-model", str(d_model), "--heads", str(heads)]
    argv += ["--args", json.dumps(entry["args"])] if entry["args"] else []
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    failed = [words[0] for words in map(str.split, done.stdout.splitlines())
              if words[1:2] == ["FAIL"] and words[0] in RIGHT]
    error = done.stderr.strip().splitlines()[-1] if done.returncode == 2 else ""
    return judged(entry, failed, error, time.perf_counter() - start)


def summary(results: list[dict]) -> dict:
    buggy = [r for r in results if not r["correct"]]
    correct = [r for r in results if r["correct"]]
    return {"buggy": len(buggy), "buggy_failed": sum(bool(r["failed"]) for r in buggy),
            "buggy_right_check": sum(bool(r["right"]) for r in buggy), "correct": len(correct),
            "correct_failed": sum(bool(r["failed"]) for r in correct),
            "errors": sum(bool(r["error"]) for r in results),
            "seconds_max": max(r["seconds"] for r in results),
            "seconds_mean": sum(r["seconds"] for r in results) / len(results)}


def report(results: list[dict], totals: dict) -> str:
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.own_attention", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=64, help="as diagnose.py --attention (default 64)")
    parser.add_argument("--heads", type=int, default=4, help="as diagnose.py --attention (default 4)")
    parser.add_argument("--command", action="store_true", help="run each class through diagnose.py (timed)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    results = [(judge_command if args.command else judge)(entry, args.d_model, args.heads) for entry in CATALOGUE]
    totals = summary(results)
    print(report(results, totals))
    print(json.dumps(totals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
