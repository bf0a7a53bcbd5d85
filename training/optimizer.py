"""AdamW with the run's settings and its schedule (training/schedule.py), for the classifier and for pretraining;
and what it gives each parameter, for the attention monitor to compare with the optimizer a run holds."""

import lightning as L
import torch

from training.schedule import WarmupThenCosine


def adamw_with_warmup(module: L.LightningModule, network: torch.nn.Module) -> dict:
    """AdamW on `network` with module.hparams' lr and weight_decay, a linear warm-up over warmup_fraction of the
    steps, then a cosine decay to zero (training/schedule.py). Weight decay on matrices only: decaying embeddings,
    biases and LayerNorm gains only hurts."""
    hparams = module.hparams
    parameters = list(network.named_parameters())
    decay = [p for name, p in parameters if decays(name, p)]
    no_decay = [p for name, p in parameters if not decays(name, p)]
    groups = [{"params": decay, "weight_decay": hparams.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel makes one pass over each weight, its gradient and moments (the update is bound by memory:
    # 2M embedding weights at every step); the same AdamW update. CPU and CUDA have it (torch >= 2.4 on CPU).
    fused = all(p.device.type in ("cpu", "cuda") for _, p in parameters)
    try:
        optimizer = torch.optim.AdamW(groups, lr=hparams.lr, fused=fused or None)
    except RuntimeError:  # a torch without the fused kernel for these weights
        optimizer = torch.optim.AdamW(groups, lr=hparams.lr)
    scheduler = WarmupThenCosine(optimizer, module.trainer.estimated_stepping_batches, hparams.warmup_fraction)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def decays(name: str, parameter: torch.Tensor) -> bool:
    """Whether adamw_with_warmup applies weight decay to this parameter: matrices, not embeddings."""
    return parameter.ndim >= 2 and "embedding" not in name


def optimizer_settings(hparams, network: torch.nn.Module) -> dict[str, dict]:
    """{parameter name: {"lr", "weight_decay"}}: what adamw_with_warmup gives each parameter of `network` by these
    hparams, for the attention monitor to compare with the optimizer the run holds (monitor/contract.py)."""
    return {name: {"lr": hparams["lr"], "weight_decay": hparams["weight_decay"] if decays(name, p) else 0.0}
            for name, p in network.named_parameters()}
