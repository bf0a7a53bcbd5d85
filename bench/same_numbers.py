"""Does this checkout compute the same numbers as an earlier commit? Logits and every parameter's gradient of a small
two-layer classifier of each attention kind, on a padded batch, built with the same seed in both trees.

    python -m bench.same_numbers 45046ee       # the commit before the one-formula clean-up (issue 19)

The earlier commit is checked out with `git worktree` into a temporary folder and run in a process of its own
(PYTHONPATH = that folder), so neither tree's modules leak into the other. Prints max |Δ| per kind; exits 1 if any
differs by more than --tolerance.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from model.kinds import ATTENTION_KINDS

ROOT = Path(__file__).resolve().parents[1]
KINDS = tuple(ATTENTION_KINDS)
# Run in each tree: NetworkConfig and AttentionClassifier(config)(ids, padding_mask).logits exist in both.
PROBE = """
import sys, torch
from model.classifier import AttentionClassifier
from model.config import NetworkConfig
out = {}
for kind in %r:
    torch.manual_seed(0)
    config = NetworkConfig(vocab_size=100, max_length=64, d_model=32, n_heads=4, n_layers=2, d_ff=64, attention=kind,
                           window=8, projection_length=16, global_tokens=2, dropout=0.0, embedding_dropout=0.0)
    network = AttentionClassifier(config)
    ids = torch.randint(2, 100, (5, 40), generator=torch.Generator().manual_seed(1))
    padding = torch.arange(40)[None] >= torch.tensor([40, 33, 17, 5, 1])[:, None]
    logits = network(ids.masked_fill(padding, 0), padding).logits
    logits.sum().backward()
    out[kind] = {"logits": logits.detach(),
                 "grads": {n: p.grad.clone() for n, p in network.named_parameters() if p.grad is not None}}
torch.save(out, sys.argv[1])
""" % (KINDS,)


def outputs(tree: Path, target: Path) -> dict:
    import torch

    subprocess.run([sys.executable, "-c", PROBE, str(target)], cwd=tree, env={"PYTHONPATH": str(tree)}, check=True)
    return torch.load(target, weights_only=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commit", help="the earlier commit (any git revision)")
    parser.add_argument("--tolerance", type=float, default=0.0, help="largest |Δ| allowed (default 0: the same bits)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        old = Path(folder) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), args.commit], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            before, after = outputs(old, Path(folder) / "old.pt"), outputs(ROOT, Path(folder) / "new.pt")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
    worst = 0.0
    for kind in KINDS:
        names = sorted(before[kind]["grads"])
        if names != sorted(after[kind]["grads"]):
            sys.exit(f"{kind}: the parameters differ between the trees")
        logit = (before[kind]["logits"] - after[kind]["logits"]).abs().max().item()
        grad = max((before[kind]["grads"][n] - after[kind]["grads"][n]).abs().max().item() for n in names)
        worst = max(worst, logit, grad)
        print(f"{kind:10} max |Δ logit| {logit:.3g}   max |Δ gradient| {grad:.3g}   ({len(names)} parameters)")
    sys.exit(0 if worst <= args.tolerance else 1)


if __name__ == "__main__":
    main()
