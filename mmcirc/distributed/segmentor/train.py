"""Spatially sharded training of a built mmseg segmentor: every rank of a spatial group
reads the same samples (augmented once, identically: the same seeds, the data-parallel
rank in place of the process rank), keeps its band of rows of the image, runs mmseg's
own ``EncoderDecoder.loss`` on the bands (the backbone, neck, decode and auxiliary
heads on :class:`~mmcirc.distributed.banded_map.BandedMap` bands, the losses by
:func:`~.loss.band_losses`) and backpropagates its part of the whole-image loss; every
parameter's gradient is then summed over the group before the optimizer step, so that
the loss and the update are one process's on the whole image. The ranks form a data x
space mesh (:func:`~mmcirc.distributed.comm.data_space_mesh`; docs/sharded.md, "Data x
space mesh").

The wrapper is :class:`SpatialParallel` (validation and test run whole images, data
parallel); :func:`shard_config` makes a config use it (``tools/train.py --shard``).
"""

import contextlib
import inspect
from typing import Dict, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import mmengine.dataset.sampler as samplers
from mmengine.dataset.utils import worker_init_fn
from mmengine.dist import all_reduce_params
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import DATA_SAMPLERS, FUNCTIONS, MODEL_WRAPPERS

from mmcirc.apis.decode import check_label_segmentor, predict_head

from ..banded_map import BandedMap, func_name, functions_of, shard_operators, tensors_in
from ..comm import comm_device, data_rank, data_space_mesh, group_rank_size
from ..layers import batch_norm_rows
from .infer import sync_weights
from .loss import LABEL, all_sum, band_losses, check_losses, refusal
from .model import check_backbone, check_size, load_operators, trace

__all__ = [
    'SpatialParallel',
    'check_trainable',
    'data_rank_sampler',
    'shard_config',
    'sum_gradients',
]

WRAPPER = 'SpatialParallel'


class _NoBackward(torch.overrides.TorchFunctionMode):
    """Refuses, while active, a torch function that takes a BandedMap with gradients
    and returns one without (an op with no backward handler), and elementwise dropout
    on a band (its mask would be drawn per band, not cut from one process's)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = tensors_in(list(args) + list(kwargs.values()))
        bands = [t for t in tensors if isinstance(t, BandedMap)]
        if bands and func in _ELEMENTWISE_DROPOUT:
            p = kwargs.get('p', args[1] if len(args) > 1 else 0.5)
            if kwargs.get('training', args[2] if len(args) > 2 else True) and p > 0:
                raise ValueError(
                    f'{LABEL}: {func_name(func)} (p={p}) draws its mask per band: '
                    'set the rate to 0 or use channel dropout (Dropout2d)'
                )
        out = func(*args, **kwargs)
        if bands and func not in _DETACH and _loses_grad(tensors, out):
            raise ValueError(f'{LABEL}: {func_name(func)} has no backward on a row-banded map')
        return out


def _grad(t: torch.Tensor) -> bool:
    return (t.local if isinstance(t, BandedMap) else t).requires_grad


def _loses_grad(inputs, out) -> bool:
    """Whether gradients enter (``inputs``) and a banded output carries none."""
    if not torch.is_grad_enabled() or not any(_grad(t) for t in inputs):
        return False
    return any(isinstance(o, BandedMap) and not _grad(o) for o in tensors_in([out]))


def _module_check(module, args, out) -> None:
    """Forward hook: a module (an attention operator's handler) that takes gradients in
    (its inputs or parameters) and returns a band without them has no backward."""
    if _loses_grad(tensors_in(list(args)) + list(module.parameters(recurse=False)), out):
        raise ValueError(f'{LABEL}: {type(module).__name__} has no backward on a row-banded map')


_DETACH = {torch.Tensor.detach, torch.Tensor.detach_, torch.detach}
_DROPOUT = ('dropout', 'alpha_dropout', 'feature_alpha_dropout')
_ELEMENTWISE_DROPOUT = set(functions_of(F, *_DROPOUT) + functions_of(torch, *_DROPOUT))
_BATCH_NORM = inspect.signature(F.batch_norm)
_NORM_ARGS = ('running_mean', 'running_var', 'weight', 'bias', 'momentum', 'eps')


class _GlobalBatchNorm(torch.overrides.TorchFunctionMode):
    """While active, ``F.batch_norm`` in training takes its statistics over the global
    batch of the data x space mesh (SyncBN over the world): a row-banded map's over
    every band of every data group (the world), a plain map's (held alike by every rank
    of a spatial group, e.g. a pooled map) over the ranks of ``data_group``. Anything
    else runs as it would (a band over the channels: its handler's refusal)."""

    def __init__(self, data_group):
        super().__init__()
        self.data_group = data_group

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.batch_norm:
            bound = _BATCH_NORM.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            x = a['input']
            stats = [a[k] for k in _NORM_ARGS]
            if a['training'] and not isinstance(x, BandedMap):
                return batch_norm_rows(x, *stats, group=self.data_group)
            if a['training'] and x.band_dim != 1:
                return x.like(batch_norm_rows(x.local, *stats, group=None))
        return func(*args, **kwargs)


def check_trainable(model, group=None) -> None:
    """One-line ValueError naming the first part of ``model`` (an mmseg segmentor, its
    BatchNorm already plain: :func:`mmengine.model.revert_sync_batchnorm`) that the
    sharded training step cannot compute exactly: the segmentor (mmseg's
    ``EncoderDecoder`` only: a cascade refines its heads' outputs in turn), the
    backbone family, a head's loss (per-pixel softmax cross-entropy only, no pixel
    sampler), then the first module and op of one traced training step (forward and
    backward on two small random images, every rank together) that has no handler, no
    backward, or draws elementwise dropout on a band. The model's parameters, buffers,
    gradients and the random state are left as they were."""
    from mmseg.models.segmentors import EncoderDecoder

    check_label_segmentor(model)
    if type(model) is not EncoderDecoder:
        raise refusal(f'segmentor {type(model).__name__}', "mmseg's EncoderDecoder only")
    check_backbone(model.backbone)
    check_losses(model)
    load_operators()
    shard_operators(model)
    saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    grads = {n: p.grad for n, p in model.named_parameters()}
    was_training = model.training

    def run(model, x):
        from mmseg.structures import SegDataSample
        from mmengine.structures import PixelData

        h, w = x.shape[-2:]
        k = int(predict_head(model).out_channels)
        samples = []
        for _ in range(x.shape[0]):
            meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w))
            samples.append(SegDataSample(metainfo=meta))
            samples[-1].gt_sem_seg = PixelData(data=torch.randint(0, max(k, 2), (1, h, w)))
        p = next(model.parameters())
        model.train()
        hooks = [m.register_forward_hook(_module_check, prepend=True) for m in model.modules()]
        try:
            with _NoBackward(), band_losses(model):
                losses = model(x.to(device=p.device, dtype=p.dtype), samples, mode='loss')
        finally:
            for hk in hooks:
                hk.remove()
        loss, _ = model.parse_losses(losses)
        loss.backward()

    try:
        dev = next(model.parameters()).device
        with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == 'cuda' else []):
            # two images: BatchNorm on a pooled map needs more than one value per channel
            trace(model, group, run, 'loss', LABEL, batch=2)
    finally:
        with torch.no_grad():
            for k, v in model.state_dict(keep_vars=True).items():
                v.copy_(saved[k])
        for n, p in model.named_parameters():
            p.grad = grads[n]
        model.train(was_training)


def sum_gradients(params, group=None, divisor: int = 1) -> None:
    """Every parameter's ``.grad`` (this rank's part) summed over ``group`` in place, in
    flat buckets of 64 MB per dtype (mmengine's ``all_reduce_params``), and divided by
    ``divisor`` (the number of data-parallel groups: their average, as DDP takes it); a
    parameter some rank holds a gradient of and another does not (its band took no part)
    gets a zero one there."""
    params = [p for p in params if p.requires_grad]
    if group_rank_size(group)[1] == 1:
        return
    held = torch.tensor([p.grad is not None for p in params], dtype=torch.float64)
    if params and params[0].device.type == 'cuda':
        held = held.to(params[0].device)
    dist.all_reduce(held, op=dist.ReduceOp.MAX, group=group)
    for p, h in zip(params, held.tolist()):
        if h and p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params if p.grad is not None]
    all_reduce_params(grads, bucket_size_mb=64, group=group)
    if divisor != 1:
        torch._foreach_div_(grads, divisor)  # one fused op, not one per parameter


def _fingerprint(inputs: torch.Tensor, data_samples) -> torch.Tensor:
    """A few sums of the batch, its labels and the random state that two ranks holding
    different samples, flips or crops, or random states, would not share (float64)."""
    out = []
    labels = torch.stack([s.gt_sem_seg.data for s in data_samples]) if data_samples else None
    for t in (inputs, labels):
        if t is None:
            continue
        t = t.detach().double()
        ramp_h = torch.arange(t.shape[-2], dtype=torch.float64, device=t.device)[:, None]
        ramp_w = torch.arange(t.shape[-1], dtype=torch.float64, device=t.device)
        out += [t.sum(), (t * ramp_h).sum(), (t * ramp_w).sum()]
    states = [torch.random.get_rng_state()]
    if inputs.device.type == 'cuda':
        states.append(torch.cuda.get_rng_state(inputs.device))
    for state in states:
        out.append((state.double() * torch.arange(1, state.numel() + 1).double()).sum())
    return torch.stack([o.cpu() for o in out])


def _check_same(inputs, data_samples, group) -> None:
    f = _fingerprint(inputs, data_samples)
    both = torch.cat([f, -f]).to(comm_device(group, inputs))
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    if not torch.equal(both[: f.numel()].cpu(), -both[f.numel() :].cpu()):
        raise RuntimeError(
            f'{LABEL}: the ranks of the spatial group hold different samples or random '
            'states (every rank must read the same samples: tools/train.py --shard sets '
            'the sampler and the data workers; randomness.diff_rank_seed must be False)'
        )


# --------------------------------------------------------------------------- wrapper
class SpatialParallel(nn.Module):
    """mmengine model wrapper of the segmentor ``module`` trained spatially sharded:
    ``shard_size`` S ranks per spatial group, W / S data-parallel groups
    (:func:`~mmcirc.distributed.comm.data_space_mesh`; None: one group, the whole
    world; ValueError, one line, for an S that does not divide W). SyncBatchNorm is made
    plain BatchNorm, whose training statistics the row-banded maps take over every band
    (one process's BatchNorm on the whole image, as mmengine's one-process runner makes
    it), and with several data groups over the global batch (:class:`_GlobalBatchNorm`);
    :func:`check_trainable` refuses what cannot be computed exactly, every rank
    together, before the first step. ``train_step`` logs the global batch's losses (the
    data groups' whole-image losses averaged) and accuracy; ``val_step`` /
    ``test_step``: the module's own on whole images."""

    def __init__(self, module, shard_size: Optional[int] = None):
        super().__init__()
        self.mesh = data_space_mesh(shard_size)  # None: the world is one spatial group
        self.group = None if self.mesh is None else self.mesh.get_group('space')
        self.data_group = None if self.mesh is None else self.mesh.get_group('data')
        self.data_size = 1 if self.mesh is None else self.mesh.size(0)
        self.module = revert_sync_batchnorm(module)
        check_trainable(self.module, self.group)
        self._synced = False

    def train_step(self, data, optim_wrapper) -> Dict[str, torch.Tensor]:
        if not self._synced and group_rank_size()[1] > 1:
            # the weights as they enter the first step (initialised, loaded or resumed
            # after the wrapper was built): rank 0's on every rank, as DDP does
            sync_weights(self.module)
        self._synced = True
        global_norm = (
            _GlobalBatchNorm(self.data_group) if self.data_size > 1 else contextlib.nullcontext()
        )
        with optim_wrapper.optim_context(self):
            data = self.module.data_preprocessor(data, training=True)
            inputs, samples = data['inputs'], data['data_samples']
            spatial = group_rank_size(self.group)[1]
            check_size(self.module, inputs.shape[-2:], spatial)  # a row for every rank
            if spatial > 1:
                _check_same(inputs, samples, self.group)
            x = BandedMap.scatter(inputs, group=self.group)  # (B, 3, h_r, W) of (B, 3, H, W)
            with band_losses(self.module, self.data_group), global_norm:
                losses = self.module(x, samples, mode='loss')
        parsed, _ = self.module.parse_losses(losses)  # this rank's part
        names = [k for k in losses if 'loss' in k]
        # every rank's part: the data groups' whole-image losses, summed
        whole = all_sum([losses[k].mean() for k in names], None) / self.data_size
        logged = dict(losses, **{k: v.to(parsed.dtype) for k, v in zip(names, whole)})
        _, log_vars = self.module.parse_losses(logged)
        optim_wrapper.backward(optim_wrapper.scale_loss(parsed))
        if optim_wrapper.should_update():
            sum_gradients(list(self.module.parameters()), None, divisor=self.data_size)
            optim_wrapper.step()
            optim_wrapper.zero_grad()
        return log_vars

    def val_step(self, data) -> list:
        return self.module.val_step(data)

    def test_step(self, data) -> list:
        return self.module.test_step(data)


# --------------------------------------------------------------------------- data
def data_rank_sampler(dataset, sampler: dict, seed=None, shard_size: Optional[int] = None):
    """The ``sampler`` config built as the data-parallel rank's
    (:func:`~mmcirc.distributed.comm.data_rank`): every rank of a spatial group draws the
    indices that rank of a data-parallel run over the data groups would (one process's,
    with one group). mmengine's samplers read the rank from ``get_dist_info`` when they are
    built; it answers the data-parallel rank and the number of data groups meanwhile."""
    rank_size = data_rank(shard_size)
    before = samplers.get_dist_info
    samplers.get_dist_info = lambda group=None: rank_size
    try:
        return DATA_SAMPLERS.build(sampler, default_args=dict(dataset=dataset, seed=seed))
    finally:
        samplers.get_dist_info = before


def data_rank_worker_init(
    worker_id: int, num_workers: int, seed: int, shard_size: Optional[int] = None
) -> None:
    """mmengine's data worker seeding of the data-parallel rank
    (:func:`~mmcirc.distributed.comm.data_rank`)."""
    worker_init_fn(worker_id, num_workers, data_rank(shard_size)[0], seed)


def shard_config(cfg, shard_size: Optional[int] = None) -> None:
    """Make a train config spatially sharded, in place: the model wrapper
    :class:`SpatialParallel` over spatial groups of ``shard_size`` ranks (None: the
    config's ``model_wrapper_cfg.shard_size``, else the whole world), the train sampler
    and data workers of the data-parallel rank (:func:`data_rank_sampler`,
    :func:`data_rank_worker_init`). ValueError (one line) for a ``shard_size`` that is
    no positive int, a config whose ranks would not draw the same samples (no
    ``randomness.seed``, ``diff_rank_seed``) or would scale the LR by the world."""
    rnd = cfg.get('randomness') or {}
    if rnd.get('seed') is None:
        raise ValueError(
            'randomness.seed must be set for sharded training: every rank draws the '
            'same samples and augmentations (e.g. --cfg-options randomness.seed=0)'
        )
    if rnd.get('diff_rank_seed'):
        raise ValueError('randomness.diff_rank_seed must be False for sharded training')
    if (cfg.get('auto_scale_lr') or {}).get('enable'):
        raise ValueError(
            'auto_scale_lr.enable must be False for sharded training: the ranks of a '
            'spatial group share one batch, the world size does not multiply it'
        )
    wrapper = cfg.get('model_wrapper_cfg') or {}
    if wrapper.get('type', WRAPPER) != WRAPPER:
        raise ValueError(
            f'model_wrapper_cfg.type must be {WRAPPER!r} for sharded training, '
            f'got {wrapper.get("type")!r}'
        )
    size = wrapper.get('shard_size') if shard_size is None else shard_size
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(
            f'shard_size must be a positive int (ranks per spatial group), got {size!r}'
        )
    cfg.model_wrapper_cfg = dict(wrapper, type=WRAPPER, shard_size=size)
    loader = cfg.train_dataloader
    if loader.sampler.get('type') != 'DataRankSampler':
        loader.sampler = dict(type='DataRankSampler', sampler=loader.sampler)
    loader.sampler.shard_size = size
    loader.worker_init_fn = dict(
        type='data_rank_worker_init',
        num_workers=loader.get('num_workers', 0),
        seed=rnd['seed'],
        shard_size=size,
    )


MODEL_WRAPPERS.register_module(name=WRAPPER, module=SpatialParallel, force=True)
DATA_SAMPLERS.register_module(name='DataRankSampler', module=data_rank_sampler, force=True)
FUNCTIONS.register_module(name='data_rank_worker_init', module=data_rank_worker_init, force=True)
