"""The held-out bugs (bench/catalogue/bugs_heldout.py) are well-formed, checked without the doctor: each plants into a tiny
ClassifierModule the way a run is built (network settings, then edit(module), the forward inside applied()), every
attention kind it names takes it without crashing, and it changes what the model computes: its output at the same
seed, or for a bug of the optimizer or the training loop, the weights after two training steps on a tiny batch."""

import functools
from contextlib import nullcontext

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

import bench.catalogue.bugs
import bench.catalogue.bugs_heldout  # noqa: F401 (registers the held-out bugs)
from bench.catalogue.bugs import BUGS, GROUPS, Plant
from model.config import NetworkConfig
from model.kinds import ATTENTION_KINDS
from training.module import ClassifierModule

HELDOUT = [entry for entry in BUGS.values() if entry.group == "heldout"]
# Bugs that leave the forward pass as it is and act only through training: the optimizer never moves some weights,
# or moves them wrongly.
TRAINING = {"key-projection-detached", "heads-in-python-list", "query-requires-grad-off", "weight-decay-one",
            "layer-decay-zero", "zero-grad-after-backward", "training-labels-out-of-step", "cosine-schedule-in-epochs",
            "weight-average-never-updated", "loss-on-probabilities"}
# Bugs that change neither the forward pass nor training: what validation reads.
VALIDATION = {"validation-labels-other-mapping"}

# Three texts of 8, 5 and 3 tokens (id 1 is [UNK], 0 [PAD]): padding, a token id equal to another tokenizer's padding
# id, more than one window of the local kinds.
INPUT_IDS = torch.tensor([[2, 3, 4, 5, 6, 7, 8, 9], [9, 1, 7, 3, 2, 0, 0, 0], [5, 1, 4, 0, 0, 0, 0, 0]])
PADDING = torch.arange(8)[None, :] >= torch.tensor([8, 5, 3])[:, None]  # (3, 8) True at padding
BATCH = {"input_ids": INPUT_IDS, "padding_mask": PADDING, "labels": torch.tensor([0, 1, 1])}


def tiny_config(kind: str, settings: dict) -> NetworkConfig:
    # No dropout outside what a bug sets: two runs at the same seed then compute the same numbers, so any difference
    # is the bug's.
    return NetworkConfig(vocab_size=16, num_classes=2, max_length=8, d_model=8, n_heads=2, dropout=0.0,
                         embedding_dropout=0.0, attention=kind, window=2, projection_length=4, global_tokens=1,
                         **settings)


def module_for(entry, kind: str, planted: bool) -> tuple[ClassifierModule, Plant]:
    """The module of a run with the bug's network settings, seeded; with the bug's edits when planted."""
    plant = Plant()
    entry.plant(plant)
    torch.manual_seed(0)
    module = ClassifierModule(network=tiny_config(kind, plant.settings), lr=0.01)
    if planted:
        plant.edit(module)
    return module, plant


def evaluated(module, plant=None) -> torch.Tensor:
    """The logits of the tiny batch in evaluation mode, inside the plant's replacements; also asks for the attention
    weights (the monitor's path), which must not crash either."""
    module.eval()
    with torch.no_grad(), plant.applied() if plant is not None else nullcontext():
        logits = module.model(INPUT_IDS, PADDING).logits
        with_weights = module.model(INPUT_IDS, PADDING, need_weights=True)
    assert len(with_weights.attention) == module.network.n_layers
    assert torch.isfinite(logits).all()
    return logits


def trained(module, plant=None) -> torch.Tensor:
    """The logits after three optimizer steps on the tiny batch (a real Trainer: its hooks are what the bugs edit;
    three, since a schedule sized for one step and one sized for two give the same first two learning rates)."""
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0)
    with plant.applied() if plant is not None else nullcontext():
        torch.manual_seed(1)
        trainer.fit(module, train_dataloaders=DataLoader([BATCH, BATCH], batch_size=None))
    return evaluated(module, plant)


def cases(training: bool):
    return [pytest.param(entry, kind, id=f"{entry.name}-{kind}") for entry in HELDOUT
            if (entry.name in TRAINING) == training and entry.name not in VALIDATION for kind in entry.kinds]


def test_heldout_bugs_are_registered_with_sources():
    assert "heldout" in GROUPS
    assert len(HELDOUT) >= 14
    assert TRAINING <= {entry.name for entry in HELDOUT}
    for entry in HELDOUT:
        assert entry.expects == ()  # any warning counts: nothing is tuned to a verdict
        assert entry.summary, entry.name
        assert "Source:" in entry.plant.__doc__, entry.name
        assert entry.kinds and set(entry.kinds) <= set(ATTENTION_KINDS), entry.name


def test_heldout_names_leave_the_other_bugs_registered():
    # The registry is keyed by name: a held-out bug named like a catalogued one would silently replace it.
    for function in vars(bench.catalogue.bugs).values():
        entry = getattr(function, "bug", None)
        if entry is not None:
            assert BUGS[entry.name] is entry, f"{entry.name} is registered twice"


@functools.cache
def healthy_logits(kind: str, settings: tuple) -> torch.Tensor:
    """The healthy model's logits with these network settings (shared by the bugs that set the same ones)."""
    torch.manual_seed(0)
    return evaluated(ClassifierModule(network=tiny_config(kind, dict(settings)), lr=0.01))


@pytest.mark.parametrize("entry, kind", cases(training=False))
def test_formula_and_network_bugs_change_the_output(entry, kind):
    planted, plant = module_for(entry, kind, planted=True)
    healthy = healthy_logits(kind, tuple(sorted(plant.settings.items())))
    assert not torch.allclose(healthy, evaluated(planted, plant), atol=1e-6, rtol=0)


@pytest.mark.parametrize("entry, kind", cases(training=True))
def test_training_bugs_leave_the_forward_pass_alone(entry, kind):
    healthy, _ = module_for(entry, kind, planted=False)
    planted, plant = module_for(entry, kind, planted=True)
    assert torch.equal(evaluated(healthy), evaluated(planted, plant))


@pytest.mark.slow
@pytest.mark.parametrize("entry", [entry for entry in HELDOUT if entry.name in TRAINING], ids=lambda e: e.name)
def test_training_bugs_change_the_weights_three_steps_on(entry):
    kind = entry.kinds[0]
    healthy, _ = module_for(entry, kind, planted=False)
    again, _ = module_for(entry, kind, planted=False)
    planted, plant = module_for(entry, kind, planted=True)
    healthy_logits = trained(healthy)
    assert torch.equal(healthy_logits, trained(again))  # same seed, same numbers: a difference below is the bug's
    assert not torch.allclose(healthy_logits, trained(planted, plant), atol=1e-6, rtol=0)


class SeenLabels(L.Callback):
    """The labels of every batch as the steps and the callbacks receive them."""

    def __init__(self):
        self.labels = {"train": [], "val": []}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.labels["train"].append(batch["labels"].tolist())

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.labels["val"].append(batch["labels"].tolist())


@pytest.mark.slow
@pytest.mark.parametrize("entry", [entry for entry in HELDOUT if entry.name in VALIDATION], ids=lambda e: e.name)
def test_validation_bugs_change_the_labels_validation_reads_and_nothing_else(entry):
    def seen(planted: bool):
        pl_module, plant = module_for(entry, entry.kinds[0], planted)
        labels = SeenLabels()
        trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                            callbacks=[labels])
        with plant.applied():
            trainer.fit(pl_module, train_dataloaders=DataLoader([BATCH], batch_size=None),
                        val_dataloaders=DataLoader([BATCH], batch_size=None))
        return labels.labels

    healthy, planted = seen(False), seen(True)
    assert healthy["train"] == planted["train"] == [BATCH["labels"].tolist()]
    assert healthy["val"] == [BATCH["labels"].tolist()] and planted["val"] != healthy["val"]


# ---- runs stuck at chance, and the loss fed probabilities: diagnose.py on the run folder ---------------------------
# (On 3 short epochs the never-updated average's fixed random answers can land above the chance line; what names it
# then is the contract: the network validated never moves while the one trained does.)

STUCK = {  # bug → what the not-learning finding (or the warning) must say about its cause
    "training-labels-out-of-step": ("not-learning", "stays at guessing the prior"),
    "validation-labels-other-mapping": ("not-learning", "not the one trained"),
    "cosine-schedule-in-epochs": ("not-learning", "weight-not-learning"),
    "weight-average-never-updated": ("weight-not-learning", "the copy validated is never updated"),
    "loss-on-probabilities": ("loss-broken", "softmax(logits)"),
}


@pytest.fixture(scope="module")
def short_data(tmp_path_factory):
    from bench.catalogue.proof import subset_files

    # 1,200 texts in batches of 16: epoch 2 ends at step 225, past the step not-learning is judged from (200)
    return subset_files("synthetic", 1200, tmp_path_factory.mktemp("stuck") / "data", validation_rows=200)


def diagnosed_run(short_data, root, name):
    from bench.catalogue.proof import SHIPPED, fit, run_args
    from inference.diagnosis import diagnose_checkpoint

    args = run_args(SHIPPED["synthetic"], *short_data, root, root / "cache", ["--data.batch_size", "16"], epochs=3)
    fit(args, BUGS[name] if name else None)
    return diagnose_checkpoint(root / "lightning_logs" / "version_0", texts=200)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STUCK))
def test_diagnose_on_the_run_folder_names_a_run_stuck_at_chance_and_its_cause(short_data, tmp_path, name):
    verdict, cause = STUCK[name]
    diagnosis = diagnosed_run(short_data, tmp_path, name)
    told = [f for f in diagnosis.warnings if f.verdict == verdict]
    assert told and cause in told[0].detail, [f.line() for f in diagnosis.warnings]


@pytest.mark.slow
def test_diagnose_on_a_healthy_short_run_gives_no_warning(short_data, tmp_path):
    diagnosis = diagnosed_run(short_data, tmp_path, None)
    assert diagnosis.warnings == [] and len(diagnosis.history) == 3
