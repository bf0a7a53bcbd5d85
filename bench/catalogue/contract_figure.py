"""The picture of a contract failure in docs/DOCTOR.md: what one attention layer handed out, stage by stage, against
its kind's definition recomputed from the layer's own input and weights (monitor/contract.py), for a healthy layer
and for planted bugs (bugs.py). A layer that computes the formula lies on the diagonal at every stage; a bug leaves
it at the first stage it changes.

    python -m bench.catalogue.contract_figure docs/doctor_contract.png [--bugs tiny-scale values-are-keys]

A random smoke-sized network (configs/smoke.yaml: d_model 32, 2 heads), full attention, one padded batch; the last
stdout line is JSON: each row's first differing stage and how, as the doctor words it.
"""

import argparse
import json
from types import SimpleNamespace

import torch

from model.attention import unpack
from model.classifier import AttentionClassifier
from model.config import NetworkConfig
from bench.catalogue.bugs import BUGS, Plant
from monitor.contract import captured, compare, dense_handout
from monitor.reference import reference


def stages(bug_name: str | None):
    """(handed out, recomputed) per stage of layer 0 on one padded batch, real query rows and allowed keys only;
    and the doctor's comparison."""
    plant = Plant()
    if bug_name:
        BUGS[bug_name].plant(plant)
    config = NetworkConfig(vocab_size=64, max_length=24, d_model=32, n_heads=2, dropout=0.0, embedding_dropout=0.0,
                           **plant.settings)
    torch.manual_seed(0)
    network = AttentionClassifier(config).eval()
    plant.edit(SimpleNamespace(model=network, online_model=network, hparams=SimpleNamespace(lr=1e-3)))
    lengths = torch.tensor([20, 16, 12, 9, 6, 3])
    padding = torch.arange(20) >= lengths[:, None]
    ids = torch.randint(4, 64, (6, 20), generator=torch.Generator().manual_seed(1)).masked_fill(padding, 0)
    with plant.applied(), torch.no_grad(), captured(network) as records:
        network(ids, padding, need_weights=True)
        record, layer = records[0], network.blocks[0].attention
        result = compare(layer, record, padding, config)
        ref = reference(layer, unpack(record["x"], ~record["padding"]), padding, scale=layer.scale, causal=False)
        weights, scores, _ = dense_handout(record["attention"], padding.shape[1])
    rows = ~padding
    pairs = ref.allowed.expand_as(weights) & rows[:, None, :, None]
    centred = lambda s: s - (s.masked_fill(~pairs, 0).sum(-1, keepdim=True) / pairs.sum(-1, keepdim=True).clamp(min=1))
    return {
        "scores (row-centred)": (centred(scores.masked_fill(~pairs, 0))[pairs], centred(ref.scores.masked_fill(~pairs, 0))[pairs]),
        "weights": (weights[pairs], ref.weights[pairs]),
        "output before W_O": (unpack(record["heads"], ~record["padding"]).double()[rows].flatten(), ref.heads[rows].flatten()),
        "output": (unpack(record["out"], ~record["padding"]).double()[rows].flatten(), ref.out[rows].flatten()),
    }, result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--bugs", nargs="+", default=["tiny-scale", "values-are-keys"])
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [None, *args.bugs]
    figure = plt.figure(figsize=(13, 3.3 * len(rows)), layout="constrained")
    said = {}
    for part, name in zip(figure.subfigures(len(rows), 1), rows):
        found, result = stages(name)
        label = name or "healthy"
        said[label] = {"stage": result["stage"], "how": result["how"], "difference": result["difference"]}
        verdict = "computes the formula" if result["stage"] is None else f"{result['stage']}: {result['how']}"
        part.suptitle(f"{label} — {verdict}", fontsize=11, weight="bold")
        axes = part.subplots(1, 4)
        for ax, (stage, (handed, recomputed)) in zip(axes, found.items()):
            ax.scatter(recomputed.numpy(), handed.numpy(), s=3, alpha=0.4)
            low, high = float(recomputed.min()), float(recomputed.max())
            ax.plot([low, high], [low, high], color="grey", linewidth=0.8)
            first = result["stage"] is not None and stage.startswith(result["stage"])
            ax.set_title(stage + (" ← first differing stage" if first else ""), fontsize=9,
                         color="#b00" if first else "black")
            ax.set_xlabel("recomputed by the definition", fontsize=8)
            ax.set_ylabel("handed out by the layer", fontsize=8)
            ax.tick_params(labelsize=7)
    figure.savefig(args.out, dpi=80)
    print(json.dumps(said))


if __name__ == "__main__":
    main()
