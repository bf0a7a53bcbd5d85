"""The healthy sweep (bench/catalogue/healthy.py, run by bench/healthy.py): which runs it plans, how it counts a
run's warnings from what the monitor stored in its checkpoint, and that a failing run is recorded with its error while
the sweep goes on. No training."""

import sys

import pytest

from model.kinds import ATTENTION_KINDS, DEFAULT_KIND
from bench.catalogue.healthy import (CONFIGURED, Run, best_metric, execute, plan, shipped_configs, table, totals,
                                      validations)


def test_the_shipped_classifier_configs_are_found_with_overlays_after_their_base():
    found = {" + ".join(p.name for p in files) for files in shipped_configs()}
    assert {"smoke.yaml", "sst2.yaml", "chnsenticorp_htl.yaml", "imdb.yaml", "imdb.yaml + imdb_local.yaml",
            "imdb.yaml + imdb_sparse.yaml", "imdb.yaml + imdb_linformer.yaml"} <= found
    assert not any("default.yaml" in name or "pretrain.yaml" in name for name in found)


def test_the_plan_repeats_each_run_per_kind_and_seed_unless_its_config_chooses_the_kind(tmp_path):
    configs = [files for files in shipped_configs() if files[-1].name in ("smoke.yaml", "imdb_local.yaml")]
    other = [name for name in ATTENTION_KINDS if name != DEFAULT_KIND][-1]
    runs = plan(configs, ["sst2"], [0, 1], [CONFIGURED, DEFAULT_KIND, other], ["--trainer.max_epochs", "3"],
                tmp_path, window=8, projection_length=16)
    names = [run.name for run in runs]
    assert len(names) == len(set(names)) == len({run.folder for run in runs})
    assert [n for n in names if n.startswith("imdb")] == ["imdb.yaml + imdb_local.yaml seed 0",
                                                         "imdb.yaml + imdb_local.yaml seed 1"]
    assert len([n for n in names if n.startswith("smoke.yaml")]) == 6
    (command,) = [run.command for run in runs if run.name == f"no config sst2 seed 1 {other}"]
    assert command[2:] == ["fit", "--data.dataset", "sst2", "--model.network.attention", other,
                           "--model.network.window", "8", "--model.network.projection_length", "16",
                           "--seed_everything", "1",
                           "--trainer.default_root_dir", str(tmp_path / f"no_config_sst2_seed_1_{other}"),
                           "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
                           "--trainer.max_epochs", "3"]
    (configured,) = [run.command for run in runs if run.name == "no config sst2 seed 0"]
    assert "--model.network.attention" not in configured  # the no-config default as it is: attention auto


def checkpoint(findings_per_validation):
    history = [{"step": 10 * (i + 1), "epoch": i, "findings": findings} for i, findings in
               enumerate(findings_per_validation)]
    return {"callbacks": {"AttentionMonitor": {"history": history},
                          "ModelCheckpoint{'monitor': 'val/acc', 'mode': 'max'}": {"monitor": "val/acc",
                                                                                   "best_model_score": 0.875},
                          "ModelCheckpoint{'monitor': None}": {"monitor": None}}}


def test_warnings_are_counted_per_validation_from_the_stored_history():
    stored = checkpoint([
        [{"verdict": "computes-formula", "layer": 0}, {"verdict": "still-learning"}],
        [{"verdict": "block-broken", "layer": 1, "detail": "first differing step: input"},
         {"verdict": "a-verdict-of-tomorrow"}, {"verdict": "optimizer-setting", "layer": None}],
    ])
    assert validations(stored) == [
        {"step": 10, "epoch": 0, "warnings": []},
        {"step": 20, "epoch": 1, "warnings": ["block-broken (layer 1): first differing step: input",
                                              "optimizer-setting (model)"]}]
    assert best_metric(stored) == {"metric": "val/acc", "value": 0.875}
    with pytest.raises(ValueError, match="no AttentionMonitor history"):
        validations({"callbacks": {}})


def test_a_failing_run_is_recorded_with_its_error_and_the_table_says_so(tmp_path):
    failing = Run("broken", [sys.executable, "-c", "import sys; print('error: --data.dataset nope: unknown'); "
                                                   "sys.exit(2)"], str(tmp_path / "broken"))
    execute(failing, threads=1, timeout=60)
    assert failing.error == "exit 2: error: --data.dataset nope: unknown" and failing.validations == []
    fine = Run("fine", [], str(tmp_path / "fine"), [{"step": 1, "epoch": 0, "warnings": []}],
               {"metric": "val/acc", "value": 0.5})
    assert totals([failing, fine]) == {"total_runs": 2, "runs_read": 1, "runs_failed": 1, "validations": 1, "warnings": 0,
                                       "runs_with_warnings": 0}
    assert "| broken | 0 | 0 | – | " in table([failing, fine]) and "| fine | 1 | 0 | val/acc 0.5000 |" in table([fine])
