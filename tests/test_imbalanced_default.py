"""The no-config default on imbalanced classes is what docs/LABELS.md "Rare classes" says and docs/RESULTS.md
"Imbalanced classes: the no-config default" measured (bench/class_weights.py): the loss unweighted whatever the
classes; from a commonest class 3 times the rarest, a balanced n-gram teacher and checkpoints chosen on macro-F1;
below that, neither. Changing the policy without new figures fails here."""

import logging

import pytest

from conftest import QUIET


def no_config_fit(tmp_path, negatives: int, positives: int, *extra):
    """`train.py fit --data.train_file ...` as a user types it (configs/default.yaml), one optimizer step."""
    import train

    rows = [f"a dull film number {i},negative" for i in range(negatives)]
    rows += [f"a fine film number {i},positive" for i in range(positives)]
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "\n".join(rows) + "\n")
    return train.main(["fit", "--data.train_file", str(data), "--data.val_file", str(data),
                       "--data.cache_dir", str(tmp_path / "cache"), "--trainer.max_steps", "1",
                       "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.callbacks", "[]", *QUIET,
                       *extra])


@pytest.mark.slow  # two short fits in this process
@pytest.mark.parametrize("negatives, imbalanced", [(60, True), (59, False)])
def test_a_no_config_run_leaves_imbalanced_classes_unweighted(tmp_path, caplog, negatives, imbalanced):
    caplog.set_level(logging.INFO)
    cli = no_config_fit(tmp_path, negatives, 20)
    assert cli.model.loss_weights is None
    assert ("class weights: none (model.class_weights auto: each text weighs the same" in caplog.text) is imbalanced
    assert cli.trainer.checkpoint_callback.monitor == ("val/f1" if imbalanced else "val/acc")
    assert ("class-balanced offsets" in caplog.text) is imbalanced  # the n-gram teacher balanced


@pytest.mark.slow
def test_balanced_weights_are_one_flag_away(tmp_path):
    cli = no_config_fit(tmp_path, 60, 20, "--model.class_weights", "balanced")
    # scikit-learn's rule, total / (classes × count), label order negative, positive
    assert cli.model.loss_weights.tolist() == pytest.approx([80 / (2 * 60), 80 / (2 * 20)])


def test_the_bench_groups_every_goemotions_label_once():
    """bench/class_weights.py's Ekman grouping covers GoEmotions' 28 labels, each in one group."""
    from bench.class_weights import EKMAN
    from data.sources import local_copy_dir

    folder = local_copy_dir("goemotions", None)
    if folder is None:
        pytest.skip("no local copy of GoEmotions ($ATTENTION_DATA_ROOT/goemotions)")
    members = [emotion for group in EKMAN.values() for emotion in group]
    assert sorted(members) == sorted((folder / "labels.txt").read_text().split())
