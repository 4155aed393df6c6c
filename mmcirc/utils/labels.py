"""Per-pixel labels from class scores that arrive a band of classes at a time (torch only)."""

from typing import Iterable, Tuple

import torch

__all__ = ['banded_argmax']


def banded_argmax(bands: Iterable[Tuple[int, torch.Tensor]]) -> torch.Tensor:
    """``torch.cat(scores).argmax(0)`` over bands ``(c0, scores)`` given in class order,
    ``scores`` (K_b, H, W) holding classes c0 .. c0 + K_b - 1: (H, W) int64 labels. One
    band is held at a time; a strict ``>`` across bands keeps the first maximum, as
    ``torch.argmax`` does."""
    best = labels = None
    for c0, scores in bands:
        idx = scores.argmax(dim=0)  # (H, W)
        val = scores.gather(0, idx[None])[0]
        del scores
        if labels is None:
            best, labels = val, (idx if c0 == 0 else idx + c0)
        else:
            better = val > best
            best = torch.where(better, val, best)
            labels = torch.where(better, idx + c0, labels)
            del better
        del val, idx  # only best and labels live while the next band is made
    return labels
