"""The layer contract's gradient checks (monitor/layer_contract.py lists them): the output's gradient in float64
against finite differences (gradcheck), and every parameter reached by a loss on the output (gradient)."""

import copy

import torch
from torch import nn
from torch.autograd.gradcheck import GradcheckError

from monitor.layer_probe import Outcome, Probe, figure

GRADCHECK_STEP, GRADCHECK_RTOL = 1e-6, 1e-3  # torch.autograd.gradcheck's defaults
COARSE_STEP, COARSE_RTOL = 1e-3, 1e-2  # a step float32 resolves: its rounding costs ~1e-7/1e-3 = 1e-4 relative, the
# step's own error ~1e-6; a wrong backward misses by O(1)


def gradcheck(probe: Probe) -> Outcome:
    """torch.autograd.gradcheck in float64. A layer that computes in float32 inside (softmax(..., dtype=float32),
    as transformers writes it) makes float64 finite differences noise: its gradient is then compared with finite
    differences at a step float32 resolves (a NOTE when they agree), rather than failed."""
    layer = copy.deepcopy(probe.layer).double().eval()
    x = torch.randn(2, 3, probe.d_model, dtype=torch.float64, generator=probe.generator)

    def f(x):
        return layer(x, key_padding_mask=None, need_weights=False)[0]

    try:
        fine = directional_error(f, x, GRADCHECK_STEP, probe.generator)
        if fine < GRADCHECK_RTOL:  # torch's own check, which passes quickly where this one does
            torch.autograd.gradcheck(f, (x.requires_grad_(),), eps=GRADCHECK_STEP, atol=1e-5, rtol=GRADCHECK_RTOL,
                                     fast_mode=True)
            return Outcome("PASS", "analytical and numerical gradients agree (float64, 2 texts of 3 tokens)",
                           {"gradient_error": fine})
        coarse = directional_error(f, x, COARSE_STEP, probe.generator)
    except GradcheckError as e:
        return Outcome("FAIL", "the gradient the layer's backward gives differs from finite differences: "
                       + str(e).splitlines()[0])
    except Exception as e:  # a layer that cannot run in float64 is not judged here
        return Outcome("NOTE", f"not run: the layer raised {type(e).__name__} in float64: {e}".splitlines()[0])
    figures = {"gradient_error": fine, "coarse_gradient_error": coarse}
    if coarse < COARSE_RTOL:
        return Outcome("NOTE", f"float64 finite differences disagree by {figure(fine)} (relative), at step "
                       f"{COARSE_STEP:g} they agree within {figure(coarse)}: the layer computes in lower precision "
                       "inside", figures)
    return Outcome("FAIL", f"uᵀ J v from the layer's backward differs from finite differences by {figure(coarse)} "
                   f"(relative) at step {COARSE_STEP:g}, by {figure(fine)} at {GRADCHECK_STEP:g}", figures)


def directional_error(f, x: torch.Tensor, step: float, generator, directions: int = 3) -> float:
    """The largest relative gap between uᵀ J v from backward and from central differences of f at x, over a few
    random directions u (outputs) and v (inputs): what gradcheck's fast mode compares."""
    worst = 0.0
    for _ in range(directions):
        v = torch.randn(x.shape, dtype=x.dtype, generator=generator)
        point = x.detach().clone().requires_grad_()
        out = f(point)
        u = torch.randn(out.shape, dtype=out.dtype, generator=generator)
        (grad,) = torch.autograd.grad((out * u).sum(), point, allow_unused=True)
        analytical = float((grad * v).sum()) if grad is not None else 0.0
        with torch.no_grad():
            numerical = float(((f(x + step * v) - f(x - step * v)) * u).sum() / (2 * step))
        worst = max(worst, abs(analytical - numerical) / max(abs(numerical), abs(analytical), 1e-12))
    return worst


def gradient(probe: Probe) -> Outcome:
    layer = probe.layer
    key_bias = probe.projections[0].key_bias if probe.projections else None
    listed = [name for name, value in vars(probe.user).items()
              if not name.startswith("_") and isinstance(value, (list, tuple, dict))
              and any(isinstance(v, nn.Module) for v in (value.values() if isinstance(value, dict) else value))]
    count = sum(1 for _ in layer.parameters())
    if not any(p.requires_grad for p in layer.parameters()):  # no loss can reach anything: nothing to call backward on
        frozen = [name for name, _ in layer.named_parameters()]
        return Outcome("FAIL", f"nothing to train: requires_grad off: {', '.join(frozen)}" if frozen else
                       "nothing to train: the layer has no parameter (attention with no W_Q, W_K, W_V learns nothing)",
                       {"without_gradient": count})
    before = {name: p.grad for name, p in layer.named_parameters()}
    for p in layer.parameters():
        p.grad = None
    try:
        out = probe.call(probe.x, probe.padding, train=True, grad=True).out
        torch.manual_seed(probe.seed)
        (out[probe.real()] * torch.randn_like(out[probe.real()])).sum().backward()
        frozen, none, zero = [], [], []
        for name, p in layer.named_parameters():
            if not p.requires_grad:
                frozen.append(name)
            elif p.grad is None:
                none.append(name)
            elif not p.grad.any() and p is not key_bias:  # K's bias adds a constant to a row of scores: no gradient
                zero.append(name)
    finally:
        for name, p in layer.named_parameters():
            p.grad = before.get(name)
    parts = [f"{what}: {', '.join(names)}" for what, names in (
        ("no gradient", none), ("zero gradient", zero), ("requires_grad off", frozen),
        ("modules kept in a plain Python container, unseen by the optimizer", listed)) if names]
    return Outcome("FAIL" if parts else "PASS", "; ".join(parts) or f"all {count} parameters get gradient",
                   {"without_gradient": len(none) + len(zero) + len(frozen)})
