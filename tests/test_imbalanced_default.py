"""The no-config default on imbalanced classes is what docs/LABELS.md "Rare classes" says and docs/RESULTS.md
"Imbalanced classes: the no-config default" measured (bench/class_weights.py): from a commonest class 3 times the
rarest, balanced class weights in the loss, a balanced n-gram teacher, checkpoints chosen on macro-F1; below that,
none of them. Changing the policy without new figures fails here."""

import logging

import pytest

from conftest import QUIET


def no_config_fit(tmp_path, negatives: int, positives: int):
    """`train.py fit --data.train_file ...` as a user types it (configs/default.yaml), one optimizer step."""
    import train

    rows = [f"a dull film number {i},negative" for i in range(negatives)]
    rows += [f"a fine film number {i},positive" for i in range(positives)]
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "\n".join(rows) + "\n")
    return train.main(["fit", "--data.train_file", str(data), "--data.val_file", str(data),
                       "--data.cache_dir", str(tmp_path / "cache"), "--trainer.max_steps", "1",
                       "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.callbacks", "[]", *QUIET])


@pytest.mark.slow  # two short fits in this process
@pytest.mark.parametrize("negatives, weighted", [(60, True), (59, False)])
def test_a_no_config_run_weighs_the_classes_from_a_ratio_of_3(tmp_path, caplog, negatives, weighted):
    caplog.set_level(logging.INFO)
    cli = no_config_fit(tmp_path, negatives, 20)
    weights = cli.model.loss_weights
    total = negatives + 20
    if weighted:  # scikit-learn's "balanced": total / (classes × count), label order negative, positive
        assert weights.tolist() == pytest.approx([total / (2 * negatives), total / (2 * 20)])
    else:
        assert weights is None
    assert cli.trainer.checkpoint_callback.monitor == ("val/f1" if weighted else "val/acc")
    assert ("class-balanced offsets" in caplog.text) is weighted  # the n-gram teacher balanced with the student
