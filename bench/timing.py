"""One timing harness, one subcommand per target; every target reports the same way.

    python -m bench.timing speed --quick        # the classifier and its attention layer against nn.TransformerEncoder
    python -m bench.timing long --quick         # every attention kind against the length L
    python -m bench.timing predict              # TextClassifier throughput, single-text latency, predict.py start-up
    python -m bench.timing onnx --ckpt RUN      # the ONNX export against PyTorch (--kinds: every attention kind)
    python -m bench.timing serve --ckpt RUN     # serve.py under load
    python -m bench.timing roofline --quick     # a training step against its floor, quiet and beside busy programs
    python -m bench.timing TARGET --help        # the target's own options

A target module (bench/speed.py, long.py, predict_speed.py, onnx_speed.py, serve_load.py, roofline.py) declares its options
(`add_arguments`) and measures (`run(args) -> (table, figures)`); the harness sets the thread count, prints the
table on stderr and, as the last line of stdout, one JSON object: the target's figures and what they were measured
under (target, torch version, threads, the 1-minute load average: other work on the machine slows every figure).
Exit status 1 when the target's figures say `failed` (serve: an error or a lost request).
"""

import argparse
import importlib
import json
import logging
import os
import sys

import torch

TARGETS = {"speed": "bench.speed", "long": "bench.long", "predict": "bench.predict_speed",
           "onnx": "bench.onnx_speed", "serve": "bench.serve_load", "roofline": "bench.roofline"}


def parser_of_targets() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="target", required=True, metavar="TARGET")
    modules = {}
    for name, module_name in TARGETS.items():
        module = modules[name] = importlib.import_module(module_name)
        command = commands.add_parser(name, help=module.__doc__.strip().splitlines()[0], description=module.__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
        threads = getattr(module, "THREADS", None)
        command.add_argument("--threads", type=int, default=threads,
                             help=f"torch threads (default: {threads or 'one per core it may use: runtime.py'})")
        module.add_arguments(command)
    return parser, modules


def main(argv=None) -> dict:
    parser, modules = parser_of_targets()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    table, figures = modules[args.target].run(args)
    print(table, file=sys.stderr)
    figures = {"target": args.target, "torch": torch.__version__, "threads": torch.get_num_threads(),
               "load_average_1min": round(os.getloadavg()[0], 2)} | figures
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    sys.exit(1 if main().get("failed") else 0)
