"""Arrows one way between packages: the network (model/) imports nothing of ours but itself and no Lightning; the
monitor's figures and heatmaps (monitor.health, monitor.heatmap, monitor.views) and checkpoint reading load no
Lightning and no data module; inference reads checkpoints without training/. Each import runs in a fresh process."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIGHTNING = ("lightning", "pytorch_lightning", "lightning_fabric", "torchmetrics")


def loaded_after(*modules: str) -> set[str]:
    """Top-level names and our own modules in sys.modules after importing `modules` in a fresh interpreter."""
    code = (f"import sys; [__import__(m) for m in {list(modules)!r}]; import json; "
            "print(json.dumps(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_the_network_is_plain_pytorch():
    loaded = loaded_after("model", "model.attention", "model.long_attention", "model.classifier", "model.config",
                          "model.checkpoint")
    ours = {name.split(".")[0] for name in loaded} & {"data", "training", "inference", "monitor"}
    assert ours == set(), f"model/ imports {ours}"
    assert {name.split(".")[0] for name in loaded} & {*LIGHTNING, "matplotlib", "tokenizers"} == set()


def test_the_monitor_figures_and_inference_load_no_lightning_and_no_data_module():
    loaded = loaded_after("monitor", "monitor.health", "monitor.heatmap", "monitor.views", "inference", "predict")
    assert {name.split(".")[0] for name in loaded} & set(LIGHTNING) == set()
    assert {"data.datamodule", "monitor.callback", "training"} & loaded == set()


def test_the_callback_is_still_found_where_configs_name_it():
    from monitor import AttentionMonitor
    from monitor.callback import AttentionMonitor as defined

    assert AttentionMonitor is defined
