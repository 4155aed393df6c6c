"""Per-pixel labels from class scores that arrive a band of classes at a time (torch only)."""

from typing import Iterable, Tuple

import torch

__all__ = ['banded_argmax', 'first_argmax']


def first_argmax(scores: torch.Tensor, offset: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(scores.amax(0), scores.argmax(0) + offset)`` of scores (K, H, W): the maximum
    and the first class that holds it, (H, W) each (labels int64).

    The same result as ``torch.argmax`` (first maximum; a NaN counts as the maximum),
    without its reduction over the outer axis, which torch's CPU kernel runs element by
    element: the vectorised ``amax``, then each class, last to first, writes its index
    where it equals the maximum. Columns holding a NaN take ``torch.argmax``.
    """
    best = scores.amax(dim=0)  # (H, W)
    last = scores.shape[0] - 1  # the fill value: the one class left where no other is
    labels = torch.full(best.shape, offset + last, dtype=torch.int64, device=best.device)
    for k in range(last - 1, -1, -1):  # last to first: the first maximum is written last
        labels.masked_fill_(scores[k] == best, offset + k)
    nan = best.isnan()
    if bool(nan.any()):  # NaN == NaN is false: those columns as torch.argmax has them
        labels = torch.where(nan, scores.argmax(dim=0) + offset, labels)
    return best, labels


def banded_argmax(bands: Iterable[Tuple[int, torch.Tensor]]) -> torch.Tensor:
    """``torch.cat(scores).argmax(0)`` over bands ``(c0, scores)`` given in class order,
    ``scores`` (K_b, H, W) holding classes c0 .. c0 + K_b - 1: (H, W) int64 labels. One
    band is held at a time; a strict ``>`` across bands keeps the first maximum, as
    ``torch.argmax`` does (each band's own is :func:`first_argmax`)."""
    best = labels = None
    for c0, scores in bands:
        val, idx = first_argmax(scores, c0)  # (H, W) each
        del scores
        if labels is None:
            best, labels = val, idx
        else:  # in place: no fresh (H, W) tensors per band (at 4096^2: 192 MB of page faults)
            better = val > best
            torch.where(better, val, best, out=best)
            torch.where(better, idx, labels, out=labels)
            del better
        del val, idx  # only best and labels live while the next band is made
    return labels
