"""Settings checked where they are given: class weights when the module is built, the callbacks' numbers in their
constructors; each a one-line error naming the setting and its value, before anything trains or is written."""

import math

import pytest

from conftest import fit
from model.errors import ConfigError


def module_with(class_weights, label_names=("0", "1"), multi_label=False):
    from model.config import NetworkConfig
    from training.module import ClassifierModule

    network = NetworkConfig(vocab_size=32, num_classes=len(label_names), max_length=8, d_model=8, n_heads=2,
                            n_layers=1, d_ff=16)
    return ClassifierModule(network=network, class_weights=class_weights, label_names=list(label_names),
                            multi_label=multi_label)


@pytest.mark.parametrize("weights, said", [
    ([-1.0, 1.0], "class '0' is -1.0"),
    ([0.0, 0.0], "class '0' is 0.0"),
    ([1.0, math.nan], "class '1' is nan"),
    ([math.inf, 1.0], "class '0' is inf"),
    ([1.0, "2"], "class '1' is '2'"),
    ([1.0, True], "class '1' is True"),
])
def test_class_weights_are_finite_and_positive(weights, said):
    with pytest.raises(ConfigError, match="model.class_weights") as stop:
        module_with(weights)
    assert said in str(stop.value) and "finite number > 0" in str(stop.value) and "\n" not in str(stop.value)


def test_class_weights_of_several_labels_are_checked_the_same_way():
    with pytest.raises(ConfigError, match="class 'urgent' is -2"):
        module_with([0.5, -2, 1], label_names=("billing", "urgent", "bug"), multi_label=True)
    with pytest.raises(ConfigError, match=r"2 numbers for 3 classes \(billing, urgent, bug\)"):
        module_with([0.5, 2], label_names=("billing", "urgent", "bug"), multi_label=True)
    assert module_with([0.5, 2, 1], label_names=("billing", "urgent", "bug"), multi_label=True) is not None


@pytest.mark.slow  # train.py in this process: the data is encoded, then the module refuses its weights
def test_train_py_says_which_class_weight_is_wrong_not_the_learning_rate(tmp_path, capfd):
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--model.class_weights", "[1.0, -1.0]")
    assert str(stop.value.code) == ("error: model.class_weights: the weight of class '1' is -1.0: need a finite "
                                    "number > 0 (1 is unweighted)")
    assert not (tmp_path / "lightning_logs").exists()
    assert "learning rate" not in capfd.readouterr().err


# ---- callbacks ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings, said", [
    ({"every": None, "min_tokens": 1}, "every must be a whole number >= 1, got None"),
    ({"every": 0}, "every must be a whole number >= 1, got 0"),
    ({"every": -3}, "got -3"),
    ({"mmap_threshold": -1}, "mmap_threshold (bytes; null: glibc's own) must be a whole number in 4096..33554432"),
    ({"mmap_threshold": 0}, "in 4096..33554432, got 0"),
    ({"mmap_threshold": 2**62}, f"got {2**62}"),
    ({"min_tokens": -1}, "min_tokens must be a whole number >= 0, got -1"),
])
def test_return_freed_memory_checks_its_arguments(settings, said):
    from training.memory import ReturnFreedMemory

    with pytest.raises(ConfigError) as stop:
        ReturnFreedMemory(**settings)
    assert said in str(stop.value) and str(stop.value).startswith("ReturnFreedMemory ")
    ReturnFreedMemory(every=1, mmap_threshold=None, min_tokens=0)  # the edges are accepted


@pytest.mark.parametrize("settings, said", [
    ({"every_n_train_steps": -1}, "every_n_train_steps (0: at validation only) must be a whole number >= 0"),
    ({"warn_from_epoch": -2}, "warn_from_epoch must be a whole number >= 0, got -2"),
    ({"health_batches": 0}, "health_batches (null: all) must be a whole number >= 1, got 0"),
    ({"health_rows": -5}, "health_rows (null: all) must be a whole number >= 1, got -5"),
    ({"check_texts": -1}, "check_texts must be a whole number >= 0, got -1"),
])
def test_the_attention_monitor_checks_its_numbers(settings, said):
    from monitor.callback import AttentionMonitor

    with pytest.raises(ConfigError) as stop:
        AttentionMonitor(**settings)
    assert said in str(stop.value)
    AttentionMonitor(health_batches=None, health_rows=None, every_n_train_steps=0, warn_from_epoch=0)


@pytest.mark.slow  # train.py in this process, up to building the callbacks
def test_a_callbacks_bad_argument_from_the_command_line_is_the_one_line(tmp_path, capfd):
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--trainer.callbacks+=training.memory.ReturnFreedMemory", "--trainer.callbacks.every", "null",
            "--trainer.callbacks.min_tokens", "1")
    assert str(stop.value.code) == "error: ReturnFreedMemory every must be a whole number >= 1, got None"
    assert "Traceback" not in capfd.readouterr().err and not (tmp_path / "lightning_logs").exists()
