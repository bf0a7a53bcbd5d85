"""A config mistake is one line (training/cli.py): where it was given, the key, and the nearest accepted name, or
jsonargparse's own message; long flags are taken whole, never by prefix."""

import sys

import pytest

import train


def refused(capsys, *args) -> str:
    with pytest.raises(SystemExit) as stop:
        train.main(["fit", *args, "--data.dataset", "nosuch"])  # a flag that parsed would fail on the dataset instead
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err.replace(f"`{train.sys.argv[0].rsplit('/', 1)[-1]} fit`", "`train.py fit`")  # the program's name


def test_an_unknown_flag_is_one_line_with_the_nearest_option(capsys):
    err = refused(capsys, "--model.lrr", "0.1")
    assert "the command line: --model.lrr is not an option of `train.py fit` (did you mean --model.lr?)" in err


@pytest.mark.parametrize("flag, meant", [("--model.network.n_head", "--model.network.n_heads"),
                                         ("--trainer.max_epoch", "--trainer.max_epochs")])
def test_a_prefix_of_a_flag_is_not_taken_for_the_flag(capsys, flag, meant):
    assert f"{flag} is not an option of `train.py fit` (did you mean {meant}?)" in refused(capsys, flag, "4")


def test_a_misspelt_key_in_a_config_file_names_the_file(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("trainer:\n  max_epoch: 3\n")
    err = refused(capsys, "--config", str(config))
    assert f"{config}: trainer.max_epoch is not an option of `train.py fit` (did you mean trainer.max_epochs?)" in err


def test_a_misspelt_callback_argument_names_the_file_and_the_class(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("trainer:\n  callbacks:\n  - class_path: training.memory.ReturnFreedMemory\n"
                      "    init_args:\n      evry: 5\n")
    err = refused(capsys, "--config", str(config))
    assert (f"{config}: trainer.callbacks[0].init_args.evry is not an argument of training.memory.ReturnFreedMemory "
            "(did you mean every?)") in err


def test_a_bad_value_names_the_key_and_the_value(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  lr: fast\n")
    err = refused(capsys, "--config", str(config))  # then jsonargparse's own words, on one line
    assert err.startswith(f"error: {config}: ") and '"model.lr"' in err and "fast" in err


def test_pretrain_is_parsed_from_its_arguments_with_sys_argv_untouched(monkeypatch, capsys):
    command_line = ["train.py", "pretrain", "--model.lrr", "0.1"]
    monkeypatch.setattr(sys, "argv", list(command_line))
    with pytest.raises(SystemExit) as stop:
        train.main()
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and sys.argv == command_line
    assert err.startswith("error: the command line: --model.lrr is not an option of")
    assert "(did you mean --model.lr?)" in err
