"""The heads' losses of sharded training: :func:`band_losses` makes mmseg's own
``BaseDecodeHead.loss`` on a band of the logits this band's part of the whole image's
loss; :func:`check_losses` refuses a head whose loss is no sum of per-pixel terms."""

import contextlib
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn

from ..banded_map import BandedMap
from ..comm import comm_device, group_rank_size
from .model import path_of

__all__ = ['LABEL', 'all_sum', 'band_losses', 'check_losses', 'refusal']

LABEL = 'sharded training'


def refusal(where: str, what: str) -> ValueError:
    """The one-line refusal of sharded training: ``where: sharded training: what``."""
    return ValueError(f'{where}: {LABEL}: {what}')


def _heads(model) -> List[nn.Module]:
    """The heads whose ``loss`` mmseg's ``EncoderDecoder.loss`` calls (decode, auxiliary)."""
    aux = getattr(model, 'auxiliary_head', None)
    aux = list(aux) if isinstance(aux, nn.ModuleList) else [aux] if aux is not None else []
    return [model.decode_head] + aux


def _losses_of(head) -> List[nn.Module]:
    loss = head.loss_decode
    return list(loss) if isinstance(loss, nn.ModuleList) else [loss]


def check_losses(model) -> None:
    """One-line ValueError for the first head whose loss is not the sum of per-pixel
    terms over the image (a loss of its own, a pixel sampler, another loss module)."""
    from mmseg.models.decode_heads.decode_head import BaseDecodeHead
    from mmseg.models.losses import CrossEntropyLoss

    for head in _heads(model):
        path = path_of(model, head)
        name = type(head).__name__
        if not isinstance(head, BaseDecodeHead) or any(
            getattr(type(head), k) is not getattr(BaseDecodeHead, k)
            for k in ('loss', 'loss_by_feat')
        ):
            raise refusal(f'{path} {name}', 'a loss of its own (not BaseDecodeHead.loss_by_feat)')
        if head.sampler is not None:
            raise refusal(f'{path} {name}', 'a pixel sampler (sampler=...) ranks the whole image')
        for loss in _losses_of(head):
            per_pixel = isinstance(loss, CrossEntropyLoss) and not (
                loss.use_sigmoid or loss.use_mask or loss.class_weight is not None
            )
            if not per_pixel or loss.reduction not in ('mean', 'sum'):
                raise refusal(
                    f'{path}.loss_decode {type(loss).__name__}',
                    'the whole-image loss is summed from per-pixel terms: '
                    "CrossEntropyLoss (softmax, no class_weight), reduction 'mean' or 'sum'",
                )


def all_sum(values: List[torch.Tensor], group) -> torch.Tensor:
    """The elementwise sum over ``group`` of the scalars ``values`` (float64, detached)."""
    t = torch.stack([v.detach().double().reshape(()) for v in values])
    if group_rank_size(group)[1] > 1:
        t = t.to(comm_device(group, t))
        dist.all_reduce(t, group=group)
    return t.cpu()


def _band_loss_by_feat(
    head, seg_logits, batch_data_samples, data_group=None
) -> Dict[str, torch.Tensor]:
    """``BaseDecodeHead.loss_by_feat`` on a band of the logits: each loss is this band's
    part of the whole image's (mmseg's own loss module on the band, its mean taken over
    the whole image's pixel count, or non-ignored count with ``avg_non_ignore``, as
    ``avg_factor``), ``acc_seg`` the whole image's (counts summed over the group), or
    with a ``data_group`` the global batch's (the counts then summed over it too)."""
    from mmseg.models.utils import resize

    labels = torch.stack([s.gt_sem_seg.data for s in batch_data_samples])  # (B, 1, H, W)
    logits = resize(seg_logits, size=labels.shape[2:], mode='bilinear',
                    align_corners=head.align_corners)  # fmt: skip
    if not isinstance(logits, BandedMap):
        raise refusal(type(head).__name__, 'the logits are not a row-banded map')
    group, ignore = logits.group, head.ignore_index
    local = logits.local  # (B, K, h_r, W)
    band = logits.cut(labels[:, 0], 1)  # (B, h_r, W)
    valid = band != ignore
    n_all, n_valid, correct = all_sum(
        [torch.tensor(float(band.numel())), valid.sum(),
         ((local.detach().argmax(1) == band) & valid).sum()],
        group,
    )  # fmt: skip
    n_valid_all = n_valid
    if data_group is not None:  # the other data groups' counts: the global batch's accuracy
        n_valid_all, correct = all_sum([n_valid, correct], data_group)
    eps = torch.finfo(torch.float32).eps
    losses = {}
    for module in _losses_of(head):
        kw = {}
        if module.reduction == 'mean':
            kw['avg_factor'] = float(n_valid if module.avg_non_ignore else n_all)
        part = module(local, band, weight=None, ignore_index=ignore, **kw)
        name = module.loss_name
        losses[name] = losses[name] + part if name in losses else part
    # mmseg's accuracy: float32 count plus eps, times 100 / (the count of non-ignored + eps)
    acc = (correct.float() + eps) * (100.0 / (float(n_valid_all) + eps))
    losses['acc_seg'] = acc.reshape(1).to(local.device)
    return losses


@contextlib.contextmanager
def band_losses(model, data_group=None):
    """While active, every head of ``model`` takes :func:`_band_loss_by_feat` as its
    ``loss_by_feat`` (mmseg's ``BaseDecodeHead.loss`` calls it on its banded logits);
    ``data_group``: the data-parallel group of a data x space mesh (None: no data
    groups), whose counts make the accuracy the global batch's."""
    heads = _heads(model)
    for head in heads:
        head.loss_by_feat = lambda logits, samples, head=head: _band_loss_by_feat(
            head, logits, samples, data_group
        )
    try:
        yield
    finally:
        for head in heads:
            del head.loss_by_feat
