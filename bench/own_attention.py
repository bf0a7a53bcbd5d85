"""The attention contract (`diagnose.py --attention`) on user-written classes it never saw: the catalogue of
bench/catalogue/user_attention/, correct and buggy, written by someone who had not read the checks. Per class its
verdicts, whether it FAILs and with which checks, and whether a FAIL names the property the class's mistake breaks;
then recall (buggy classes that FAIL with a right check / buggy classes), the FAILs on correct classes, the runtime.

    python -m bench.own_attention                      # in this process, each class built as diagnose.py builds it
    python -m bench.own_attention --command            # each class through `python diagnose.py --attention` (timed)
    python -m bench.own_attention --d-model 32 --heads 4
    python -m bench.own_attention --published --command   # the classes copied unchanged from public code, per
                                                            # family and per source (vit-pytorch needs einops)
    python -m bench.own_attention --published --learn     # each correct one trained on the synthetic task against
                                                            # the built-in full layer of its shape (minutes a class)

The catalogue names properties of attention (its CATEGORIES), not the checks; bench/catalogue/proof.py's RIGHT
says which categories each check's FAIL is evidence of. Nothing here sets a threshold: the checks are those of
monitor/layer_contract.py as they are.
"""

import argparse
import json
import logging
import subprocess
import sys
import time

from bench.common import ROOT
from bench.catalogue.proof import RIGHT, USER_CLASSES, judge, judged
from bench.catalogue.scores import class_report, class_summary
from bench.catalogue.user_attention.catalogue import CATALOGUE
from bench.catalogue.user_attention.published.catalogue import PUBLISHED
from bench.catalogue.user_attention.published_buggy.catalogue import BUGGY


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.own_attention", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=64, help="as diagnose.py --attention (default 64)")
    parser.add_argument("--heads", type=int, default=4, help="as diagnose.py --attention (default 4)")
    parser.add_argument("--command", action="store_true", help="run each class through diagnose.py (timed)")
    parser.add_argument("--published", action="store_true", help="the classes copied unchanged from public code "
                        "(user_attention/published/) and their one-edit buggy variants (published_buggy/) instead "
                        "of the written ones")
    parser.add_argument("--learn", action="store_true", help="train each correct class on the synthetic task "
                        "(monitor/learning.py) instead of the contract; one line a class, as it finishes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    entries = PUBLISHED + BUGGY if args.published else CATALOGUE
    if args.learn:
        return learn_report([e for e in entries if e["correct"]])
    results = [(judge_command if args.command else judge)(entry, args.d_model, args.heads) for entry in entries]
    totals = class_summary(results)
    print(class_report(results, totals))
    if args.published:
        print(group_report(results, entries))
    print(json.dumps(totals))
    return 0


def learn_report(entries: list[dict]) -> int:
    """Validation accuracy on the synthetic task, each class against the built-in full layer of its shape."""
    from monitor.learning import learns

    print("| class | accuracy | built-in full, same shape | difference | minutes |\n|---|---|---|---|---|", flush=True)
    for entry in entries:
        start = time.perf_counter()
        try:
            found = learns(f"{USER_CLASSES / entry['file']}:{entry['class_name']}", entry["args"])
        except Exception as error:  # a class the product cannot take: counted, with its first line
            print(f"| {entry['file']}:{entry['class_name']} | not taken: {str(error).splitlines()[0][:80]} | | | |",
                  flush=True)
            continue
        print(f"| {entry['file']}:{entry['class_name']} | {found['accuracy']:.3f} | {found['built_in']:.3f} | "
              f"{found['accuracy'] - found['built_in']:+.3f} | {(time.perf_counter() - start) / 60:.1f} |", flush=True)
    return 0


def group_report(results: list[dict], entries: list[dict]) -> str:
    """Per family and per source: correct classes with exit 0 (no FAIL, no error), published mistakes caught."""
    lines = ["", "| group | classes | correct: exit 0 | correct: FAIL | not taken (error) | mistakes caught |",
             "|---|---|---|---|---|---|"]
    groups = {}
    for result, entry in zip(results, entries):
        for name in (*(f"family {f}" for f in entry["family"]), f"source {entry['source']}"):
            groups.setdefault(name, []).append(result)
    for name, members in sorted(groups.items()):
        correct = [r for r in members if r["correct"]]
        clean = sum(not r["failed"] and not r["error"] for r in correct)
        failed = sum(bool(r["failed"]) for r in correct)
        errors = sum(bool(r["error"]) for r in members)
        wrong = [r for r in members if not r["correct"]]
        caught = f"{sum(bool(r['right']) for r in wrong)}/{len(wrong)}" if wrong else "-"
        lines.append(f"| {name} | {len(members)} | {clean}/{len(correct)} | {failed} | {errors} | {caught} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
