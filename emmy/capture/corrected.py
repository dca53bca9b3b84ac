"""Decompositions that replace torch's own where torch's give a different answer from eager torch.

Each is checked against eager torch in tests/test_ops.py; the torch version that had the fault is
named, so a later torch can be tried without it.
"""

from __future__ import annotations

import torch

_MEAN, _SUM = 1, 2  # torch's Reduction enum: 0 none, 1 mean, 2 sum


def multilabel_margin_loss_forward(scores: torch.Tensor, target: torch.Tensor, reduction: int):
    """(loss, is_target) of aten.multilabel_margin_loss_forward.

    A sample's labels are the target slots before its first -1. torch 2.13's decomposition gathers
    slot 0's score into every slot after that -1 and keeps their margins in the sum (on one random
    5x6 example eager torch gave 0.69, the decomposition 1.99); here a margin counts only for a
    label slot j and a class i that is not a label: sum over j, i of max(0, 1 - (x[label_j] - x[i]))
    / classes."""
    vector = scores.dim() < 2
    x = scores.reshape(1, -1) if vector else scores
    labels = target.reshape(1, -1) if vector else target
    classes = x.shape[1]
    slots = torch.arange(classes, device=labels.device)
    first_end = torch.where(labels == -1, slots, classes).amin(dim=1, keepdim=True)
    filled = slots < first_end  # [N, slot]: the slots that hold labels
    label_scores = x.gather(1, torch.where(filled, labels, 0))  # [N, slot]
    is_label = (slots.view(1, 1, -1) == torch.where(filled, labels, -1).unsqueeze(-1)).any(dim=1)  # [N, class]
    margins = (1.0 - label_scores.unsqueeze(-1) + x.unsqueeze(1)).clamp_min(0) / classes  # [N, slot, class]
    counted = filled.unsqueeze(-1) & ~is_label.unsqueeze(1)
    per_sample = torch.where(counted, margins, 0.0).sum(dim=(1, 2))
    if reduction == _MEAN:
        loss = per_sample.mean()
    elif reduction == _SUM:
        loss = per_sample.sum()
    else:
        loss = per_sample.reshape(scores.shape[:-1])
    return loss, is_label.to(scores.dtype).reshape(target.shape)


def corrected_decompositions() -> dict:
    """ATen op -> the decomposition emmy uses in place of torch's."""
    return {torch.ops.aten.multilabel_margin_loss_forward.default: multilabel_margin_loss_forward}
