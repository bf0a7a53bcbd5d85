"""Each validation and test pass scored on all its outputs at its end (training/calibration.py does the math):

    fit      with model.calibration, the temperature (one label a text) or per-label thresholds (several) are fitted
             on the validation outputs first, and kept on the module (its checkpoint stores them)
    figures  macro-F1 (several labels a text: also micro-F1 and subset accuracy as acc), ECE (and before the
             temperature), F1 per class; in TensorBoard the confusion matrix and the reliability diagram; outside a
             fit (validate, test) the per-class table in the log

ClassifierModule attaches it (configure_callbacks); its validation and test steps return their logits."""

import logging

import lightning as L
import torch

from training import calibration as calib

log = logging.getLogger(__name__)


class SplitScores(L.Callback):
    def __init__(self):
        self.outputs = []  # (logits, labels) of the pass's batches

    def on_validation_epoch_start(self, trainer, pl_module):
        self.outputs = []

    def on_test_epoch_start(self, trainer, pl_module):
        self.outputs = []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.outputs.append((outputs["logits"].detach().float().cpu(), batch["labels"].cpu()))

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            self.outputs = []
            return
        self.score(pl_module, "val", fit=trainer.state.fn == "fit" and pl_module.hparams.calibration)

    def on_test_epoch_end(self, trainer, pl_module):
        self.score(pl_module, "test", fit=False)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        # Plain numbers and lists: the checkpoint still loads with torch.load(weights_only=True); the module reads
        # them back (on_load_checkpoint), for load_from_checkpoint as for a resumed fit.
        checkpoint["calibration"] = {"temperature": float(pl_module.temperature),
                                     "thresholds": list(pl_module.thresholds or [])}

    def score(self, module, stage: str, fit: bool) -> None:
        outputs, self.outputs = self.outputs, []
        if not outputs:
            return
        logits = torch.cat([o[0] for o in outputs])
        labels = torch.cat([o[1] for o in outputs])
        multi = module.hparams.multi_label
        if fit and multi:
            module.thresholds = calib.fit_thresholds(logits.sigmoid(), labels)
        elif fit:
            module.temperature = calib.fit_temperature(logits, labels)
        probabilities = module.probabilities(logits)
        thresholds = module.label_thresholds if multi else None
        figures = calib.scores(probabilities, labels, multi, thresholds)
        per_class = figures.pop("per_class")
        if multi:  # single-label acc and f1 are the torchmetrics objects the module logs per step
            module.log_dict({f"{stage}/{name}": value for name, value in figures.items()}, prog_bar=stage == "val")
        module.log(f"{stage}/ece", calib.expected_calibration_error(probabilities, labels, multi))
        if not multi:
            module.log(f"{stage}/temperature", module.temperature)
            raw = logits.softmax(-1)
            module.log(f"{stage}/ece_uncalibrated", calib.expected_calibration_error(raw, labels, multi))
        for name, row in zip(module.label_names, per_class.tolist()):
            module.log(f"{stage}_per_class/f1_{name}", row[2])
        if module.trainer.state.fn != "fit":
            log.info("%s per class (%s):\n%s", stage, "thresholds fitted on validation" if multi and module.thresholds
                     else "temperature %.3f" % module.temperature, calib.per_class_table(per_class, module.label_names))
        draw_figures(module, stage, probabilities, labels, thresholds)


def draw_figures(module, stage: str, probabilities, labels, thresholds) -> None:
    """The confusion matrix and the reliability diagram as TensorBoard images at the module's step."""
    experiment = getattr(module.logger, "experiment", None)
    if not hasattr(experiment, "add_figure"):  # TensorBoard only
        return
    import matplotlib.pyplot as plt

    multi, step = module.hparams.multi_label, module.global_step
    matrix = calib.confusion(probabilities, labels, multi, thresholds)
    for name, figure in (("confusion_matrix", calib.confusion_figure(matrix, module.label_names,
                                                                       f"{stage} confusion, step {step}")),
                         ("reliability", calib.reliability_figure(probabilities, labels, multi,
                                                                  f"{stage} reliability, step {step}"))):
        experiment.add_figure(f"{stage}/{name}", figure, global_step=step)
        plt.close(figure)
