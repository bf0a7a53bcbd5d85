"""The doctor's contract checks (monitor/contract.py, monitor/dynamics.py): every kind computes its formula to
rounding, and a bug planted against each check (the formula, the settings, every weight learning, the invariances,
a model that does not learn) is named with what breaks."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.catalogue.bugs import BUGS, Plant
from conftest import refuses_causal
from inference.diagnosis import Diagnosis
from model.attention import AttentionWeights
from model.classifier import AttentionClassifier
from model.config import NetworkConfig
from model.kinds import ATTENTION_KINDS
from monitor.contract import contract_checks, formula_settings
from monitor.doctor import NOT_LEARNING_STEPS, Finding, diagnose, warnings
from monitor.dynamics import TrainingDynamics
from monitor.health import AttentionHealth

LENGTHS = [10, 7, 4, 2, 1, 6]  # texts shorter than max_length (16): the padding check can pad them further


def network(kind="full", plant=None, **settings):
    torch.manual_seed(0)
    config = NetworkConfig(**(dict(vocab_size=30, num_classes=2, max_length=16, d_model=16, n_heads=2, n_layers=2,
                                   attention=kind, window=2, projection_length=4, global_tokens=1, dropout=0.0,
                                   embedding_dropout=0.0, bias=True) | (plant.settings if plant else {}) | settings))
    model = AttentionClassifier(config)
    if plant is not None:
        plant.edit(SimpleNamespace(model=model, online_model=model, hparams=SimpleNamespace(lr=1e-3)))
    return model


def batches():
    ids = torch.randint(4, 30, (len(LENGTHS), max(LENGTHS)), generator=torch.Generator().manual_seed(1))
    padding = torch.arange(max(LENGTHS)) >= torch.tensor(LENGTHS)[:, None]
    return [{"input_ids": ids.masked_fill(padding, 0), "padding_mask": padding,
             "labels": torch.tensor([0, 1] * (len(LENGTHS) // 2))}]


def checked(bug_name=None, kind="full", **settings):
    """The contract checks and the findings on a tiny network with the bug planted (None: healthy)."""
    plant = Plant()
    if bug_name:
        BUGS[bug_name].plant(plant)
    model = network(kind, plant, **settings)
    with plant.applied():
        checks = contract_checks(model, batches()) | formula_settings(model.config)
    return checks, diagnose(None, checks, None, model.config)


@pytest.mark.parametrize("causal", [False, True])
def test_every_kind_computes_its_formula_to_rounding(registered_kind, causal):
    if causal and refuses_causal(registered_kind):
        pytest.skip(f"{registered_kind} refuses the look-ahead mask")
    checks, findings = checked(kind=registered_kind, causal=causal, pooling="mean")
    assert [layer["stage"] for layer in checks["formula"]] == [None, None]
    assert max(layer["largest"] for layer in checks["formula"]) < 1e-5
    assert [block["stage"] for block in checks["blocks"]] == [None, None] and checks["shared"] == []
    assert max(block["largest"] for block in checks["blocks"]) < 1e-5
    assert all(delta < 1e-5 for delta in checks["invariance"].values()) and not math.isnan(checks["invariance"]["padding"])
    assert [f.verdict for f in findings if f.layer is not None] == ["computes-formula"] * 2
    assert warnings(findings) == []


@pytest.mark.parametrize("name, kind, stage, how", [
    ("tiny-scale", "full", "scores", "0.001 × the formula's (a constant factor)"),
    ("no-scaling", "linformer", "scores", "16 × the formula's"),
    ("look-ahead", "sparse", "mask", "a look-ahead mask"),
    ("padding-ignored", "local", "mask", "of them padding"),
    ("softmax-over-queries", "full", "weights", "softmax over the queries (the other axis)"),
    ("half-weights", "local", "weights", "0.5 × the formula's"),
    ("values-are-keys", "sparse", "output before W_O", "the weights mix K instead of V (another operand)"),
    ("values-are-keys", "linformer", "output before W_O", "the weights mix K instead of V"),
])
def test_a_changed_formula_is_named_by_its_first_differing_stage(name, kind, stage, how):
    checks, findings = checked(name, kind)
    assert checks["formula"][0]["stage"] == stage and how in checks["formula"][0]["how"]
    (broken, *_) = [f for f in findings if f.verdict == "formula-broken"]
    assert f"first differing stage: {stage}, " in broken.line() and how in broken.line()


def test_a_scale_setting_that_breaks_the_formula_is_named_with_its_flag():
    _, findings = checked(scale=0.001)  # heads of 8: 0.001 is 0.0028 × 1/√d_k
    (setting,) = [f for f in warnings(findings) if f.verdict == "formula-setting"]
    assert "--model.network.scale 0.001 is 0.00283 × 1/√d_k" in setting.line()
    assert [f.verdict for f in findings if f.layer is not None] == ["computes-formula"] * 2  # the layer obeys it
    for scale in (None, 1 / math.sqrt(8), 0.5):  # 1/√d_k, and 1.4× it: no warning
        assert [f.verdict for f in warnings(checked(scale=scale)[1])] == []


def test_padding_or_batch_neighbours_that_reach_a_prediction_break_an_invariance():
    checks, findings = checked("no-padding-mask")  # padding embedded and attended like words
    assert checks["invariance"]["neighbours"] > 1e-3 and checks["invariance"]["padding"] > 1e-3
    assert {f.detail for f in findings if f.verdict == "invariance-broken"} == {
        "padding the batch further changes predictions", "a text alone is predicted otherwise than with its batch"}


def train_steps(model, optimizer, steps=3):
    """A few optimizer steps on the tiny batches, watched by TrainingDynamics; returns its summary."""
    dynamics = TrainingDynamics()
    dynamics.watch(SimpleNamespace(model=model, online_model=model, _trainer=SimpleNamespace(optimizers=[optimizer])))
    (batch,) = batches()
    for step in range(steps):
        loss = F.cross_entropy(model(batch["input_ids"], batch["padding_mask"]).logits, batch["labels"])
        optimizer.zero_grad()
        loss.backward()
        dynamics.gradients()
        optimizer.step()
        dynamics.update({"loss": loss.detach()}, step + 1, len(batch["labels"]))
        dynamics.count_labels(batch["labels"], 2)
    return dynamics.summary()


def detach_values(model):
    """A stray .detach() on V in every layer: W_V gets no gradient."""
    for block in model.blocks:
        attend = block.attention.attend
        block.attention.attend = lambda q, k, v, *args, attend=attend, **options: attend(q, k, v.detach(), *args,
                                                                                         **options)


@pytest.mark.parametrize("pooling", ["mean", "attention"])
def test_every_weight_learns_in_a_healthy_network(pooling):
    model = network(pooling=pooling)
    summary = train_steps(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    assert summary["parameters"] == {} and summary["prior_loss"] == pytest.approx(math.log(2))


@pytest.mark.parametrize("plant, name, why", [
    (detach_values, "blocks.0.attention.w_v.weight", "no gradient reaches it"),
    (lambda model: model.head.weight.requires_grad_(False), "head.weight", "requires_grad is off"),
    (lambda model: setattr(model.blocks[1], "extra", [nn.Linear(16, 16)]), "blocks.1.extra[0]",
     "kept in a plain Python container"),
    ("optimizer without the head", "head.bias", "the optimizer does not hold it"),
    ("learning rate 0 for the head", "head.weight", "the optimizer never moved it"),
])
def test_a_weight_that_does_not_learn_is_named(plant, name, why):
    model = network()
    parameters = dict(model.named_parameters())
    if callable(plant):
        plant(model)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    elif plant == "optimizer without the head":
        optimizer = torch.optim.AdamW([p for n, p in parameters.items() if not n.startswith("head.")], lr=1e-3)
    else:
        head = [parameters["head.weight"], parameters["head.bias"]]
        optimizer = torch.optim.AdamW([{"params": [p for p in model.parameters() if all(p is not h for h in head)]},
                                       {"params": head, "lr": 0.0}], lr=1e-3)
    stuck = train_steps(model, optimizer)["parameters"]
    assert name in stuck and why in stuck[name]
    (finding, *_) = [f for f in diagnose(None, None, {"parameters": stuck}) if f.detail.startswith(name)]
    assert finding.verdict == "weight-not-learning" and finding.severity == "warning"


def test_a_model_at_the_class_prior_after_its_first_epochs_is_not_learning():
    def verdicts(epoch, loss, balanced, step=300, classes=2):
        dynamics = {"epoch": epoch, "step": step, "train_loss": loss, "prior_loss": math.log(2),
                    "balanced_accuracy": balanced, "classes_seen": classes}
        return [f.verdict for f in warnings(diagnose(None, None, dynamics))]

    assert verdicts(2, 0.69, 0.60) == ["not-learning"]  # the loss of guessing the prior
    assert verdicts(3, 0.50, 0.51) == ["not-learning"]  # a constant answer's balanced accuracy
    assert verdicts(3, 0.50, 0.34, classes=3) == ["not-learning"]  # 1/3 with three classes
    assert verdicts(1, 0.69, 0.50) == []  # a slow start: the healthy synthetic run is at 0.695 after epoch 0
    assert verdicts(2, 0.32, 0.92) == []  # the healthy synthetic run at epoch 2
    # Epochs cut short (limit_train_batches): epoch 2 at step 120 is still the start of the run.
    assert verdicts(2, 0.69, 0.50, step=120) == []
    assert verdicts(2, 0.69, 0.50, step=NOT_LEARNING_STEPS) == ["not-learning"]
    # Validation texts of one class only (a pass cut short on a file sorted by label): nothing to tell apart.
    assert verdicts(2, 0.40, 1.0, classes=1) == []
    assert verdicts(2, 0.69, 1.0, classes=1) == ["not-learning"]  # the loss still does


def test_not_learning_reads_balanced_accuracy_so_a_skewed_validation_sample_is_not_guessing():
    """97% of the validation texts in one class (ChnSentiCorp's label-sorted file, validation cut to 10 batches): a
    model right on 97.5% of them is at the majority rate, yet tells the classes apart."""
    from monitor.callback import AttentionMonitor

    monitor = AttentionMonitor.__new__(AttentionMonitor)
    monitor.correct = monitor.seen = 0
    monitor.val_labels = monitor.val_hits = None
    monitor.check_batches, monitor.check_limit, monitor.health_batches = [], 0, 0
    labels = torch.tensor([0] * 970 + [1] * 30)
    logits = torch.zeros(1000, 2)
    logits[torch.arange(1000), labels] = 1.0  # right on every text ...
    logits[:25, :] = torch.tensor([0.0, 1.0])  # ... but 25 of the common class
    trainer = type("Trainer", (), {"sanity_checking": False, "is_global_zero": True})()
    monitor.on_validation_batch_end(trainer, None, {"logits": logits}, {"labels": labels}, 0)
    assert monitor.correct / monitor.seen == pytest.approx(0.975)  # below the majority rate 0.97 + 0.01
    balanced = (monitor.val_hits / monitor.val_labels).mean().item()
    assert balanced == pytest.approx((945 / 970 + 1.0) / 2)
    dynamics = {"epoch": 3, "step": 500, "train_loss": 0.2, "prior_loss": math.log(2), "balanced_accuracy": balanced,
                "classes_seen": 2}
    assert not warnings(diagnose(None, None, dynamics))


@pytest.mark.parametrize("multi_label", [False, True])
def test_the_prior_loss_is_the_training_losss_own_minimum_for_a_constant_answer(multi_label):
    """With class weights (the no-config default on imbalanced data) a model that always answers the best constant
    gets exactly prior_loss from the training loss: a healthy weighted run sits far below it, never at it."""
    torch.manual_seed(0)
    if multi_label:
        labels = (torch.rand(400, 3) < torch.tensor([0.5, 0.1, 0.02])).float()
        labels[0] = 1.0  # every label present
        weights = (400 - labels.sum(0)) / labels.sum(0)  # pos_weight, as data/labels.balanced_weights
    else:
        labels = torch.cat([torch.zeros(380), torch.ones(20)]).long()  # 95% one class
        weights = 400 / (2 * torch.bincount(labels).double())
    dynamics = TrainingDynamics()
    dynamics.count_labels(labels, 3 if multi_label else 2)
    dynamics.loss_weights, dynamics.multi_label = weights, multi_label

    def loss(constant):  # the training loss of one logit vector answered for every text
        logits = constant.expand(len(labels), -1)
        if multi_label:
            return F.binary_cross_entropy_with_logits(logits, labels, pos_weight=weights, reduction="none").mean()
        return F.cross_entropy(logits, labels, weight=weights.float(), reduction="none").mean()

    constant = torch.zeros(1, 3 if multi_label else 2, requires_grad=True)
    optimizer = torch.optim.LBFGS([constant], max_iter=200, line_search_fn="strong_wolfe")
    optimizer.step(lambda: (optimizer.zero_grad(), loss(constant).backward())[0] or loss(constant))
    assert dynamics.prior_loss() == pytest.approx(float(loss(constant).detach()), rel=1e-4)
    unweighted = TrainingDynamics()
    unweighted.count_labels(labels, 3 if multi_label else 2)
    unweighted.multi_label = multi_label
    assert dynamics.prior_loss() > 1.5 * unweighted.prior_loss()  # the weights matter: the old figure was too low


def test_diagnose_judges_every_stored_validation():
    health = AttentionHealth()
    health.update([AttentionWeights(torch.full((1, 1, 2, 2), 0.5), torch.zeros(1, 1, 2, 2), None)])
    hidden = Finding("formula-setting", None, None, {"scale_factor": 0.004}, "--model.network.scale 0.001")
    history = [{"step": 0, "epoch": 0, "findings": [Finding("padding-leak", 0, None, {})]},  # before any training
               {"step": 50, "epoch": 0, "findings": [hidden]}, {"step": 100, "epoch": 1, "findings": []}]
    diagnosis = Diagnosis(None, {"dataset": "synthetic"}, 10, health.compute(), [], history)
    assert diagnosis.warnings == [hidden]


# ---- the blocks around attention, weights that are their own, the configured optimizer ---------------------------


def rewire_blocks(model, forward):
    """Every block's forward written as forward(block, x, key_padding_mask, need_weights)."""
    for block in model.blocks:
        block.forward = lambda x, key_padding_mask, need_weights=False, block=block: forward(
            block, x, key_padding_mask, need_weights)


def ffn_residual_dropped(block, x, key_padding_mask, need_weights):
    attended, weights = block.attention.forward_packed(x, key_padding_mask, need_weights)
    x = block.norm1(x + block.dropout(attended))
    return block.norm2(block.dropout(block.ffn(x))), weights


def norm_left_out(block, x, key_padding_mask, need_weights):
    attended, weights = block.attention.forward_packed(x, key_padding_mask, need_weights)
    return x + attended, weights


# One kind whose keys are the text's tokens and one whose keys are projections of them, from the registry.
KEY_LAYOUTS = [next(name for name, kind in ATTENTION_KINDS.items() if kind.keys_are_tokens is tokens)
               for tokens in (True, False)]


@pytest.mark.parametrize("kind", KEY_LAYOUTS)
@pytest.mark.parametrize("d_ff", [0, 24])
def test_a_block_written_otherwise_is_named_by_its_first_differing_step(kind, d_ff):
    checks, findings = checked("norm-before-attention", kind, d_ff=d_ff)
    # Block 0 gets raw embeddings, so its attention's input differs first; a block whose input is already
    # normalised (after a feed-forward's LayerNorm) differs first after attention, where the stream is not normalised.
    assert checks["blocks"][0]["stage"] == "attention's input" and "pre-norm" in checks["blocks"][0]["how"]
    assert checks["blocks"][1]["stage"] in ("attention's input", "residual + LayerNorm after attention")
    assert {f.verdict for f in warnings(findings)} == {"block-broken"}  # attention itself computes its formula
    model = network(kind, d_ff=d_ff)
    rewire_blocks(model, norm_left_out)
    (first, *_) = contract_checks(model, batches())["blocks"]
    assert first["stage"] == "residual + LayerNorm after attention" and "the LayerNorm left out" in first["how"]


def test_a_feed_forward_without_its_residual_is_named():
    model = network(d_ff=24)
    rewire_blocks(model, ffn_residual_dropped)
    (first, second) = contract_checks(model, batches())["blocks"]
    assert first["stage"] == "residual + LayerNorm after the feed-forward" and "the residual left out" in first["how"]
    assert second["stage"] == "residual + LayerNorm after the feed-forward"


def test_embeddings_that_lose_their_positions_on_the_way_are_named():
    model = network()
    model.position_embedding.forward = lambda positions: torch.zeros(*positions.shape, 16)
    (first, second) = contract_checks(model, batches())["blocks"]
    assert first["stage"] == "input (the embeddings)" and "without their position vectors" in first["how"]
    assert second["stage"] is None


def test_a_weight_assigned_twice_is_named_with_both_parameters():
    checks, findings = checked("values-projection-reused")
    assert ["blocks.0.attention.w_k.weight", "blocks.0.attention.w_v.weight", "the same tensor"] in checks["shared"]
    (line, *_) = [f.line() for f in warnings(findings) if f.verdict == "shared-weight"]
    assert "blocks.0.attention.w_k.weight and blocks.0.attention.w_v.weight are the same tensor" in line
    model = network()
    model.blocks[1].attention.w_q = model.blocks[0].attention.w_q  # across layers
    assert ["blocks.0.attention.w_q.bias", "blocks.1.attention.w_q.bias", "the same tensor"] in \
        contract_checks(model, batches())["shared"]
    model = network()
    with torch.no_grad():  # a checkpoint stores a shared weight twice: loaded, it is two equal matrices
        model.blocks[0].attention.w_v.weight.copy_(model.blocks[0].attention.w_q.weight)
    assert contract_checks(model, batches())["shared"] == [
        ["blocks.0.attention.w_q.weight", "blocks.0.attention.w_v.weight", "exactly the same values"]]


def module_and_optimizer(plant_name=None, decay_everything=False):
    """A tiny ClassifierModule (model.weight_decay 0.01) with the bug planted, and the optimizer it configures."""
    from training.module import ClassifierModule

    plant = Plant()
    if plant_name:
        BUGS[plant_name].plant(plant)
    torch.manual_seed(0)
    module = ClassifierModule(network=NetworkConfig(vocab_size=30, max_length=16, d_model=16, n_heads=2), lr=1e-3,
                              weight_decay=0.01)
    plant.edit(module)
    module._trainer = SimpleNamespace(estimated_stepping_batches=20)
    if decay_everything:  # AdamW on model.parameters() with one weight decay: biases and LayerNorm gains decay too
        return module, torch.optim.AdamW(module.model.parameters(), lr=1e-3, weight_decay=0.01)
    return module, module.configure_optimizers()["optimizer"]


def optimizer_findings(module, optimizer):
    from monitor.contract import optimizer_differences

    network, configured = module.configured_optimizer()
    found = optimizer_differences(network, [optimizer], configured)
    return found, [f.line() for f in warnings(diagnose(None, {"optimizer": found}))]


def test_the_configured_optimizer_is_found_as_configured():
    module, optimizer = module_and_optimizer()
    assert optimizer_findings(module, optimizer) == ([], [])


@pytest.mark.parametrize("plant, said", [
    ("learning-rate-30x", "lr 0.03 in the optimizer, configured model.lr 0.001, for token_embedding.weight, "),
    ("head-learning-rate", "lr 0.01 in the optimizer, configured model.lr 0.001, for head.weight, head.bias"),
    ("decay everything", "weight_decay 0.01 in the optimizer, configured model.weight_decay 0, for "),
])
def test_an_optimizer_other_than_the_configured_one_is_named_with_both_values(plant, said):
    if plant == "decay everything":
        module, optimizer = module_and_optimizer(decay_everything=True)
    else:
        module, optimizer = module_and_optimizer(plant)
    found, lines = optimizer_findings(module, optimizer)
    assert len(found) == 1 and any(said in line and "optimizer-setting" in line for line in lines), lines


def test_diagnose_compares_the_stored_optimizer_with_the_stored_settings():
    from inference.diagnosis import stored_optimizer_differences

    groups = [{"params": [0, 1, 2], "lr": 2e-4, "initial_lr": 1e-3, "weight_decay": 0.01},
              {"params": [3, 4], "lr": 2e-4, "initial_lr": 1e-3, "weight_decay": 0.0}]
    stored = {"hyper_parameters": {"lr": 1e-3, "weight_decay": 0.01}, "optimizer_states": [{"param_groups": groups}]}
    assert stored_optimizer_differences(stored) == []
    groups[1]["initial_lr"] = 0.0
    groups[0]["weight_decay"] = 1.0
    assert stored_optimizer_differences(stored) == [
        {"setting": "weight_decay", "value": 1.0, "configured": 0.01, "parameters": ["parameter group 0 (3 parameters)"]},
        {"setting": "lr", "value": 0.0, "configured": 1e-3, "parameters": ["parameter group 1 (2 parameters)"]}]
    assert stored_optimizer_differences({"hyper_parameters": {"lr": 1e-3}}) == []  # saved without the optimizer


def test_the_checks_run_at_full_float32_precision_and_leave_the_setting_as_found():
    # train.py allows TensorFloat-32 products, which on a GPU differ from the float64 reference by about 1e-3.
    model, seen = network(), []
    model.blocks[0].register_forward_hook(lambda *args: seen.append(torch.get_float32_matmul_precision()))
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        contract_checks(model, batches())
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
    assert seen and set(seen) == {"highest"}
