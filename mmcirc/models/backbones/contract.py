"""The one backbone contract of mmcirc: the pyramids (CA-PVT, CA-Swin, Core-PVT,
Core-Swin) and the isotropic models (CA-DeiT, VECA) keep it alike.

mmdet, mmseg and mmpretrain expect of a backbone:

* ``arch``: a named variant of ``arch_zoo`` or a dict of its settings;
* ``out_indices``: the stages (pyramids) or blocks (isotropic models) whose outputs
  ``forward`` returns, an int or ints, negative ones counted from the end;
* ``frozen_stages``: ``-1`` nothing, ``0`` the stem (patch embedding), ``k`` also the
  first k stages / blocks: requires_grad off and eval mode, kept through ``train()``;
* ``norm_eval``: normalisation layers stay in eval mode while training;
* ``with_cp``: each block under ``torch.utils.checkpoint`` (memory for compute);
* with a core bank: the active core count C' (``num_cores``, ``set_num_cores``),
  parsed by :func:`mmcirc.ops.core.parse_num_cores` against :data:`CORE_PRESETS`.

:class:`BackboneContract` does the first five (a family gives its arch checks and
frozen parts), :class:`ElasticCores` the last.

Torch only (CA-DeiT and VECA need nothing else): with mmengine installed the base
class is mmengine's ``BaseModule`` (``init_cfg``), else a stand-in that stores it.
"""

import importlib.util
from numbers import Integral, Real
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.utils.checkpoint import checkpoint

from mmcirc.ops.circulant import BOUNDARIES, check_choice, check_scale
from mmcirc.ops.core import parse_num_cores

HAS_MMENGINE = importlib.util.find_spec('mmengine') is not None
if HAS_MMENGINE:
    from mmengine.model import BaseModule
else:  # torch only: init_cfg is stored and ignored

    class BaseModule(nn.Module):
        """Stand-in for mmengine's BaseModule (no init_cfg handling)."""

        def __init__(self, init_cfg=None):
            super().__init__()
            self.init_cfg = init_cfg
            self.is_init = False

        def init_weights(self):
            self.is_init = True


__all__ = [
    'BackboneContract',
    'BaseModule',
    'ElasticCores',
    'HAS_MMENGINE',
    'NORM_TYPES',
    'call_block',
    'check_circulant',
    'check_images',
    'check_positive',
    'check_positive_int',
    'check_rate',
    'is_int',
    'pad_to_multiple',
    'parse_out_indices',
    'spatial_size',
]

#: What ``norm_eval`` keeps in eval mode.
NORM_TYPES = (_BatchNorm, _InstanceNorm, nn.GroupNorm, nn.LayerNorm)


def is_int(value) -> bool:
    """An int that is not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_positive_int(owner: str, name: str, value) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(f'{owner}: {name} must be a positive int, got {value!r}')
    return int(value)


def check_positive(owner: str, name: str, value) -> float:
    """A positive real number (e.g. an MLP ratio)."""
    if not (isinstance(value, Real) and not isinstance(value, bool) and value > 0):
        raise ValueError(f'{owner}: {name} must be positive, got {value!r}')
    return value


def check_rate(owner: str, name: str, value) -> float:
    """A dropout / drop-path probability in [0, 1)."""
    if not (isinstance(value, Real) and not isinstance(value, bool) and 0 <= value < 1):
        raise ValueError(f'{owner}: {name} must be in [0, 1), got {value!r}')
    return value


def check_circulant(owner: str, boundary, scale) -> None:
    """``boundary`` and ``scale`` of circulant attention (:mod:`mmcirc.ops.circulant`),
    checked when the backbone is built, before any block is."""
    try:
        check_choice('boundary', boundary, BOUNDARIES)
        check_scale(scale)
    except ValueError as e:
        raise ValueError(f'{owner}: {e}') from None


def parse_out_indices(out_indices, num: int, unit: str = 'stages') -> tuple:
    """``out_indices`` (an int or ints in [-num, num - 1]) -> sorted, non-negative,
    unique indices; ValueError naming the range (``unit``: what is indexed) otherwise."""
    if is_int(out_indices):
        out_indices = (out_indices,)
    if (
        not isinstance(out_indices, (list, tuple))
        or not out_indices
        or not all(is_int(i) and -num <= i < num for i in out_indices)
    ):
        raise ValueError(
            f'out_indices must be an int or a non-empty sequence of ints in '
            f'[-{num}, {num - 1}] ({unit} 0..{num - 1}), got {out_indices!r}'
        )
    return tuple(sorted({int(i) % num for i in out_indices}))


def check_images(owner: str, x) -> None:
    """The forward's input: a (B, C, H, W) batch with B >= 1, else a one-line ValueError
    naming ``owner``. Sizes that are not ints (symbolic in a captured graph, a
    ``torch.fx`` proxy) are not checked: a graph is checked when it runs."""
    shape = getattr(x, 'shape', None)
    if type(shape) is not torch.Size:
        return
    if len(shape) != 4:
        raise ValueError(
            f'{owner}: input must be a (B, C, H, W) batch of images, got shape {tuple(shape)}'
        )
    if type(shape[0]) is int and shape[0] < 1:
        raise ValueError(
            f'{owner}: input batch is empty (shape {tuple(shape)}); give at least one image'
        )


def spatial_size(x: torch.Tensor) -> tuple:
    """(H, W) of a (..., H, W) tensor: ints (eager; under ``torch.jit.trace``, whose
    sizes are tensors, made ints), torch.export's symbolic sizes left symbolic (an
    ``int()`` there would bake the traced size into a dynamic graph)."""
    h, w = x.shape[-2], x.shape[-1]
    return (int(h), int(w)) if torch.jit.is_tracing() else (h, w)


def pad_to_multiple(x: torch.Tensor, size: int) -> torch.Tensor:
    """x (..., H, W) zero padded at the bottom / right to multiples of ``size`` (x
    itself when H and W are; a ``torch.fx`` leaf function in mmcirc.timm)."""
    pad_h, pad_w = -x.shape[-2] % size, -x.shape[-1] % size
    if pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h))
    return x


def call_block(block: nn.Module, *args):
    """``block(*args)`` of a backbone with ``with_cp``: under ``torch.utils.checkpoint``
    when autograd records (activations recomputed in backward, not stored; RNG state
    preserved); a ``torch.fx`` trace records the block itself (no checkpoint)."""
    x = args[0]
    if isinstance(x, torch.Tensor) and torch.is_grad_enabled() and x.requires_grad:
        return checkpoint(block, *args, use_reentrant=False)
    return block(*args)


class BackboneContract(BaseModule):
    """arch, out_indices, frozen_stages + train(), norm_eval and with_cp (abstract).

    Class attributes of a family:
        arch_zoo (dict): named variants (aliases allowed), each a dict of settings.
        arch_names (tuple, optional): the names an error lists (None: ``arch_zoo``'s).
        arch_keys (tuple): the keys an arch dict must have.
        arch_defaults (dict): optional keys of an arch dict and their values.
        stage_unit (str): what ``out_indices`` / ``frozen_stages`` count (``'stages'``
            or ``'blocks'``).

    A family's ``__init__`` calls :meth:`_setup_contract`, builds its modules, then
    calls :meth:`_freeze_stages`; it runs its blocks with :func:`call_block`.
    """

    arch_zoo: Dict[str, dict] = {}
    arch_names: Optional[Tuple[str, ...]] = None
    arch_keys: Tuple[str, ...] = ()
    arch_defaults: Dict[str, object] = {}
    stage_unit: str = 'stages'
    norm_eval: bool = False
    with_cp: bool = False
    frozen_stages: int = -1

    @classmethod
    def _parse_arch(cls, arch) -> dict:
        """``arch`` (a name in ``arch_zoo``, any case, or a dict) -> the checked settings."""
        name, names = cls.__name__, cls.arch_names or tuple(cls.arch_zoo)
        optional = tuple(cls.arch_defaults)
        keys = ', '.join(cls.arch_keys) + (f'[, {", ".join(optional)}]' if optional else '')
        if isinstance(arch, str):
            if arch.lower() not in cls.arch_zoo:
                raise ValueError(
                    f'{name}: arch must be one of {names} or a dict with keys {keys}; got {arch!r}'
                )
            arch = cls.arch_zoo[arch.lower()]
        elif not isinstance(arch, dict):
            raise ValueError(
                f'{name}: arch must be a str in {names} or a dict, got {type(arch).__name__}'
            )
        elif not set(cls.arch_keys) <= set(arch) <= set(cls.arch_keys) | set(optional):
            need = f'the keys {sorted(cls.arch_keys)}'
            need = f'{need} (and optionally {sorted(optional)})' if optional else f'exactly {need}'
            raise ValueError(f'{name}: an arch dict needs {need}, got {sorted(arch)}')
        return cls._check_arch(dict(cls.arch_defaults, **arch))

    @classmethod
    def _check_arch(cls, arch: dict) -> dict:
        """Check (and normalise) the values of an arch dict with the right keys: here
        ``arch_keys`` positive ints, then a positive ``mlp_ratio``."""
        for key in (k for k in cls.arch_keys if k != 'mlp_ratio'):
            check_positive_int(cls.__name__, f'arch {key}', arch[key])
        check_positive(cls.__name__, 'arch mlp_ratio', arch['mlp_ratio'])
        return arch

    def _setup_contract(
        self, *, num_stages: int, out_indices, frozen_stages, norm_eval=False, with_cp=False
    ) -> None:
        """Parse and check ``out_indices`` and ``frozen_stages`` against ``num_stages``."""
        self.num_stages = int(num_stages)
        self.out_indices = parse_out_indices(out_indices, self.num_stages, self.stage_unit)
        if not is_int(frozen_stages) or not -1 <= frozen_stages <= self.num_stages:
            raise ValueError(
                f'{type(self).__name__}: frozen_stages must be an int in '
                f'[-1, {self.num_stages}], got {frozen_stages!r}'
            )
        self.frozen_stages = int(frozen_stages)
        self.norm_eval = bool(norm_eval)
        self.with_cp = bool(with_cp)

    def _frozen_parts(self) -> Tuple[List[nn.Module], List[nn.Parameter]]:
        """(modules, loose parameters) that ``frozen_stages`` freezes."""
        raise NotImplementedError

    def _freeze_stages(self) -> None:
        modules, params = self._frozen_parts()
        for m in modules:
            m.eval()
            params = list(params) + list(m.parameters())
        for param in params:
            param.requires_grad = False

    def train(self, mode: bool = True):
        """Set train/eval mode, keeping frozen stages (and, with ``norm_eval``, the
        normalisation layers) in eval mode."""
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, NORM_TYPES):
                    m.eval()
        return self


class ElasticCores:
    """Elastic core count C' (METHOD.md 2) of a backbone with core banks (mixin).

    The first C' cores of a bank of ``num_cores_max`` are used; C' is an int in
    [step, num_cores_max], a multiple of ``num_cores_step`` (1, or the chunk a bank
    comes in), or a preset name of :data:`CORE_PRESETS`. A family calls
    :meth:`_setup_cores` and, when its modules hold C' themselves, overrides
    :meth:`_apply_num_cores`.
    """

    num_cores_step: int = 1

    def _setup_cores(self, num_cores, num_cores_max) -> None:
        """Check the bank size and C' (None: the whole bank)."""
        self.num_cores_max = check_positive_int(type(self).__name__, 'num_cores_max', num_cores_max)
        value = self.num_cores_max if num_cores is None else num_cores
        self._num_cores = parse_num_cores(value, self.num_cores_max, self.num_cores_step)

    @property
    def num_cores(self) -> int:
        """Active core count C'."""
        return self._num_cores

    def set_num_cores(self, num_cores) -> None:
        """Set the active core count C' (see the class docstring); takes effect from
        the next forward. ValueError (C' unchanged) for any other value."""
        self._num_cores = parse_num_cores(num_cores, self.num_cores_max, self.num_cores_step)
        self._apply_num_cores(self._num_cores)

    def _apply_num_cores(self, num_cores: int) -> None:
        """Pass a new C' to the modules that hold it (default: none do)."""
