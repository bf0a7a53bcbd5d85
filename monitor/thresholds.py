"""The doctor's thresholds that more than one check reads, each defined once: the contract on a run's layers
(monitor/contract.py, monitor/doctor.py) and on a user's class alone (monitor/layer_contract.py,
monitor/layer_formula.py) judge with the same numbers."""

FORMULA_TOLERANCE = 1e-3  # a layer's stage against its kind's definition recomputed: float32 rounding gives ≤ 1e-5
# (relative; weights: absolute), orders of magnitude below; the smallest planted change (weights × 0.5) gives 0.5
SCALE_FACTOR = 4.0  # a scale (configured, or the score spread a class shows) this many times what 1/√d_k gives, or
# 1/this, is far off: "no scaling" with heads of 16 is 4×, "divided by d_k" ¼×; 0.001 with heads of 16 is 0.004×
INVARIANCE = 1e-4  # a prediction's largest |Δp| (a run) or a layer output's relative change (a class alone) when a
# text is padded further or run alone: float32 rounding stays orders of magnitude below (≤ 1e-6)
