"""Two CPU processes (DDP over gloo) read the one data cache and train on disjoint shares of the training texts, with
the monitor on, and the checkpoint counts the steps of one rank."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ONE_PROBE, QUIET, ROOT, SMOKE

# Run as a script: Lightning's DDP starts the second process by running this same command again (LOCAL_RANK set).
SCRIPT = textwrap.dedent("""
    import json, os, sys
    from lightning.pytorch import Callback
    from train import cli

    class Recorder(Callback):
        def __init__(self):
            self.texts, self.batches = [], 0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.batches += 1
            for ids, mask in zip(batch["input_ids"], batch["padding_mask"]):
                self.texts.append(" ".join(str(int(i)) for i in ids[~mask]))

        def on_train_end(self, trainer, pl_module):
            out = os.path.join(sys.argv[1], f"rank{trainer.global_rank}.json")
            with open(out, "w") as f:
                json.dump({"texts": self.texts, "batches": self.batches, "world_size": trainer.world_size}, f)

    run = cli(sys.argv[2:], run=False)
    run.trainer.callbacks.append(Recorder())
    run.trainer.fit(run.model, run.datamodule)
""")


@pytest.mark.slow
def test_two_processes_train_on_disjoint_texts_of_one_cache(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(SCRIPT)
    rows = ["text,label"] + [f"word{i} and more,{'pos' if i % 2 else 'neg'}" for i in range(400)]  # every text unique
    (tmp_path / "texts.csv").write_text("\n".join(rows) + "\n")
    args = ["--config", SMOKE, *QUIET, "--data.train_file", str(tmp_path / "texts.csv"), "--data.vocab_size", "1000",
            "--data.tokenizer", "word", "--data.batch_size", "32", "--trainer.max_epochs", "1",
            "--trainer.limit_val_batches", "1", "--trainer.accelerator", "cpu", "--trainer.devices", "2",
            "--trainer.strategy", "ddp", "--trainer.default_root_dir", str(tmp_path / "run"),
            "--data.cache_dir", str(tmp_path / "cache"), *ONE_PROBE]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_PORT": str(29500 + os.getpid() % 1000)}
    done = subprocess.run([sys.executable, str(script), str(tmp_path), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1))
    assert first["world_size"] == second["world_size"] == 2
    assert first["batches"] == second["batches"] == 6  # 360 training texts: 12 batches of up to 32, 6 on each rank
    assert set(first["texts"]).isdisjoint(second["texts"])
    assert len(first["texts"]) + len(second["texts"]) == 360  # and together every training text
    assert len(set(first["texts"])) == len(first["texts"])  # distinct texts encode to distinct ids
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 1  # one cache, built once, read by both ranks
    last = torch.load(tmp_path / "run" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 6  # the steps of one rank: each took half the batches
