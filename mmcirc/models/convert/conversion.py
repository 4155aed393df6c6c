"""What every checkpoint converter shares: read a file through mmcirc's safe loader,
unwrap its tensors, trace where each converted tensor came from
(:func:`trace_provenance`), build the one :class:`ConversionResult` against the target
model, report it (:func:`format_summary`) and write it atomically
(:func:`save_checkpoint`). The released whole-model files (CA-DeiT, VECA) are told apart
here (:data:`RELEASED`), so that a file of one given to the other is named as such.
Torch only at import (the safe loader, mmdet and mmengine where they are used).
"""

import os.path as osp
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch

__all__ = [
    'ARCH_LETTERS',
    'OUTPUT_ROOT',
    'RELEASED',
    'CheckpointKindError',
    'ConversionError',
    'ConversionResult',
    'ReleasedKind',
    'build_result',
    'expect_released',
    'isotropic_result',
    'format_summary',
    'load_source',
    'save_checkpoint',
    'shape_mismatches',
    'strip_common_prefix',
    'tensors_of',
    'trace_provenance',
    'unwrap_state_dict',
]

#: Arch name -> the letter of the config and checkpoint names (``ca_pvt_s``, ``ca_deit_b``).
ARCH_LETTERS = {'tiny': 't', 'small': 's', 'medium': 'm', 'large': 'l', 'base': 'b'}

#: Where converted checkpoints go by default (``{OUTPUT_ROOT}/<variant>_<suffix>.pth``).
OUTPUT_ROOT = 'work_dirs/pretrained'


class ConversionError(ValueError):
    """The checkpoint does not fit the requested conversion (one readable message)."""


class CheckpointKindError(ConversionError):
    """The checkpoint is the other released kind (``found``: ``'cadeit'`` or ``'veca'``)."""

    def __init__(self, message: str, found: str):
        super().__init__(message)
        self.found = found


def load_source(path: str, trust: bool = False):
    """Load a checkpoint file with mmcirc's safe loader (tensors, containers and the
    types mmengine writes; ``trust=True`` allows full unpickling of this one file)."""
    from mmcirc.engine import CheckpointReadError, load_from_local, trust_checkpoint

    if not osp.isfile(osp.expanduser(path)):
        raise FileNotFoundError(f'checkpoint not found: {path}')
    if trust:
        trust_checkpoint(path)
    try:
        return load_from_local(path, map_location='cpu')
    except CheckpointReadError as err:  # empty, truncated, text: in words, naming the file
        raise ConversionError(f'cannot read {path}: {err.reason}') from None
    except (RuntimeError, EOFError, IndexError, KeyError, ValueError) as err:  # not one
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConversionError(f'cannot read {path}: {reason}') from None


def unwrap_state_dict(ckpt) -> tuple:
    """``(state_dict, outside)``: the tensors of a checkpoint, unwrapped from
    ``'state_dict'`` / ``'model'`` / ``'module'``, without a ``module.`` (DDP) prefix
    and, if any key has it, reduced to the ``backbone.`` entries with the prefix
    removed. ``outside`` lists the keys left out (e.g. ``neck.*``, ``head.*``) and any
    non-tensor entries."""
    if not isinstance(ckpt, dict):
        raise ConversionError(f'expected a checkpoint dict, got {type(ckpt).__name__}')
    for wrapper in ('state_dict', 'model', 'module'):
        if isinstance(ckpt.get(wrapper), dict):
            ckpt = ckpt[wrapper]
            break
    if not ckpt:
        raise ConversionError('the checkpoint holds no tensors')
    outside = [k for k, v in ckpt.items() if not torch.is_tensor(v)]
    sd = OrderedDict((k, v) for k, v in ckpt.items() if torch.is_tensor(v))
    if not sd:
        raise ConversionError(
            f'no tensors found in the checkpoint (top-level keys: {list(ckpt)[:8]})'
        )
    sd = strip_common_prefix(sd, 'module.')
    if any(k.startswith('backbone.') for k in sd):
        outside += [k for k in sd if not k.startswith('backbone.')]
        sd = OrderedDict(
            (k[len('backbone.') :], v) for k, v in sd.items() if k.startswith('backbone.')
        )
    return sd, outside


def strip_common_prefix(sd, prefix: str):
    """``sd`` without ``prefix`` (e.g. DDP's ``module.``) when every key has it, else ``sd``."""
    if sd and all(k.startswith(prefix) for k in sd):
        return OrderedDict((k[len(prefix) :], v) for k, v in sd.items())
    return sd


def tensors_of(sd, what: str) -> 'OrderedDict[str, torch.Tensor]':
    """The tensor entries of the dict ``sd`` (``what`` names it in the errors)."""
    if not isinstance(sd, dict):
        raise ConversionError(f'{what}: expected a dict of tensors, got {type(sd).__name__}')
    out = OrderedDict((k, v) for k, v in sd.items() if torch.is_tensor(v))
    if not out:
        raise ConversionError(f'{what}: no tensors found (keys: {list(sd)[:6]})')
    return out


@dataclass(frozen=True)
class ReleasedKind:
    """A released whole-model checkpoint file (one of :data:`RELEASED`).

    Attributes:
        kind: its name in :class:`CheckpointKindError` (``found``).
        name: how reports call it (``'CA-DeiT'``).
        holds: what the file holds, in short; ``holds_full``: in full.
        detect: ``detect(ckpt) -> bool`` on the loaded file.
    """

    kind: str
    name: str
    holds: str
    holds_full: str
    detect: Callable


def _is_cadeit(ckpt) -> bool:
    sd = ckpt.get('model', ckpt.get('state_dict', ckpt)) if isinstance(ckpt, dict) else None
    return isinstance(sd, dict) and any(
        re.match(r'^(module\.)?blocks\.\d+\.attn\.gate\.0\.weight$', str(k)) for k in sd
    )


#: The released whole-model files by family, in the order they are recognised.
RELEASED = {
    'veca': ReleasedKind(
        kind='veca',
        name='VECA',
        holds='{"student": ..., "config": ...}',
        holds_full='{"student": state dict, "config": {...}}',
        detect=lambda ckpt: isinstance(ckpt, dict) and isinstance(ckpt.get('student'), dict),
    ),
    'deit': ReleasedKind(
        kind='cadeit',
        name='CA-DeiT',
        holds='{"model": ...} with circulant attention',
        holds_full='{"model": state dict} with blocks.*.attn.gate.0.weight (circulant attention)',
        detect=_is_cadeit,
    ),
}


def expect_released(ckpt, family: str) -> None:
    """Raise unless ``ckpt`` is the released checkpoint of ``family``: a
    :class:`CheckpointKindError` when it is another family's released file (the first
    that recognises it), else a :class:`ConversionError` saying what was expected."""
    if family not in RELEASED:
        raise ConversionError(f'family must be one of {tuple(RELEASED)}, got {family!r}')
    want = RELEASED[family]
    found = next((k for k in RELEASED.values() if k.detect(ckpt)), None)
    if found == want:
        return
    if found is not None:
        raise CheckpointKindError(
            f'this is a {found.name} checkpoint ({found.holds}), not {want.name}', found=found.kind
        )
    keys = list(ckpt)[:6] if isinstance(ckpt, dict) else type(ckpt).__name__
    raise ConversionError(f'not a {want.name} checkpoint: expected {want.holds_full}, got {keys}')


def trace_provenance(convert, sd) -> Dict[str, List[str]]:
    """Run ``convert`` on stand-ins of the source tensors (each filled, without
    allocating, with its own index) and read which source tensors every output was
    made from: {output key: [source keys]}, nothing assumed about the mapping (e.g.
    mmdet's ``pvt_convert`` concatenating ``q`` and ``kv`` into ``in_proj_weight``)."""
    names = list(sd)
    tags = OrderedDict(
        (k, torch.tensor(i, dtype=torch.int64).expand(v.shape))
        for i, (k, v) in enumerate(sd.items())
    )
    prov = {}
    for key, t in convert(tags).items():
        if t.numel() == 0:
            ids = []
        elif all(s == 0 for s in t.stride()):
            ids = [int(t[(0,) * t.dim()])]
        else:
            ids = torch.unique(t).tolist()
        prov[key] = [names[i] for i in ids]
    return prov


@dataclass
class ConversionResult:
    """A converted checkpoint and what happened to every tensor.

    Attributes:
        state_dict: target keys -> tensors (model order); everything but ``new``.
        source_layout: layout the source was read in.
        loaded: target keys filled from the source.
        sources: for each loaded key, the source keys it was made from.
        new_attention: target parameters of the replaced attention not in the source
            (circulant/core attention, CPE, core banks: left to the model's init).
        new_other: other target parameters the source lacks (e.g. Swin ``norm0-2``:
            the official classifier has only the last output norm).
        from_model: target buffers the source lacks, copied from the built model
            (constants such as Swin's ``relative_position_index``).
        unused: source keys that went nowhere (e.g. stage 1-2 SRA, ``head``).
        resized: target keys whose tables were resized (``pos_embed_size``).
        meta: what goes under ``'meta'`` in the saved file.
        sizes: values per target key.
        whole_model: a released model converted whole (every tensor is expected to
            load): the report lists what is new or unused, key by key.
    """

    state_dict: 'OrderedDict[str, torch.Tensor]'
    source_layout: str
    loaded: List[str] = field(default_factory=list)
    sources: Dict[str, List[str]] = field(default_factory=dict)
    new_attention: List[str] = field(default_factory=list)
    new_other: List[str] = field(default_factory=list)
    from_model: List[str] = field(default_factory=list)
    unused: List[str] = field(default_factory=list)
    resized: List[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    sizes: Dict[str, int] = field(default_factory=dict)
    whole_model: bool = False

    @property
    def new(self) -> List[str]:
        return self.new_attention + self.new_other


def shape_mismatches(tensors, target, source: str = 'checkpoint') -> List[str]:
    """``'key: <source> (shape) vs model (shape)'`` for every key of ``tensors`` (in
    their order) that ``target`` (the model's state dict) holds with another shape."""
    return [
        f'{k}: {source} {tuple(v.shape)} vs model {tuple(target[k].shape)}'
        for k, v in tensors.items()
        if k in target and v.shape != target[k].shape
    ]


def _contiguous_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone(memory_format=torch.contiguous_format)


def build_result(
    model,
    tensors: Dict[str, torch.Tensor],
    sources: Dict[str, List[str]],
    source_keys: Sequence[str],
    layout: str,
    *,
    converter: str,
    prefix: str = '',
    extra: Optional[Dict[str, tuple]] = None,
    attention_keys: Sequence[str] = (),
    resized: Sequence[str] = (),
    whole_model: bool = False,
    info: Optional[dict] = None,
    meta: Optional[dict] = None,
) -> ConversionResult:
    """The :class:`ConversionResult` of ``tensors`` (``model``'s keys) for ``model``.

    Every tensor must have the model's shape (else :class:`ConversionError`). Saved
    keys are ``prefix`` + the model's keys, in the model's order, then ``extra``
    (``{saved key: (tensor, source keys)}``, e.g. a classifier head). Model keys not
    given: buffers are copied from the model (``from_model``), parameters in
    ``attention_keys`` are ``new_attention``, the others ``new_other``. ``sources``
    gives each tensor's source keys; ``source_keys`` not among them are ``unused``, as
    are ``tensors`` the model has no place for. ``meta`` of the result: ``converter``,
    ``info``, what was loaded / new / unused, then ``meta``.
    """
    target = model.state_dict()
    bad = shape_mismatches(tensors, target)
    if bad:
        raise ConversionError(
            f'{len(bad)} tensor(s) do not fit {type(model).__name__}:\n'
            + '\n'.join(f'  {b}' for b in bad[:6])
        )
    params = {k for k, _ in model.named_parameters()}
    attention = set(attention_keys)
    result = ConversionResult(
        state_dict=OrderedDict(),
        source_layout=layout,
        resized=list(resized),
        sizes={prefix + k: v.numel() for k, v in target.items()},
        whole_model=whole_model,
    )
    for key, value in target.items():
        name = prefix + key
        if key in tensors:
            result.state_dict[name] = _contiguous_copy(tensors[key])
            result.loaded.append(name)
            result.sources[name] = list(sources[key])
        elif key not in params:
            result.state_dict[name] = value.detach().clone()
            result.from_model.append(name)
        elif key in attention:
            result.new_attention.append(name)
        else:
            result.new_other.append(name)
    for name, (value, src) in (extra or {}).items():
        result.state_dict[name] = _contiguous_copy(value)
        result.loaded.append(name)
        result.sources[name] = list(src)
        result.sizes[name] = value.numel()
    used = {s for k in result.loaded for s in result.sources[k]}
    result.unused = [k for k in source_keys if k not in used]
    result.unused += [k for k in tensors if k not in target]
    result.meta = dict(
        converter=converter,
        **(info or {}),
        loaded=len(result.loaded),
        new=list(result.new),
        unused=list(result.unused),
        **(meta or {}),
    )
    return result


def isotropic_result(model, tensors, sources, source_keys, meta, extra=None):
    """:func:`build_result` of a released CA-DeiT / VECA file converted whole (layout
    ``'official'``, keys under ``backbone.``, ``extra`` as there)."""
    return build_result(
        model,
        tensors,
        sources,
        list(source_keys),
        'official',
        converter='mmcirc.models.convert_isotropic',  # the name in the files since the first
        # release (the module is now this one): converted files stay byte-identical
        prefix='backbone.',
        extra=extra,
        whole_model=True,
        meta=meta,
    )


def _group(keys: Sequence[str]) -> List[str]:
    """Compact key list: stage and block indices become ``*``, with counts."""
    counts = OrderedDict()
    for k in keys:
        g = re.sub(r'^(layers|stages)\.\d+\.', r'\1.*.', k)
        g = re.sub(r'\.blocks\.\d+\.', '.blocks.*.', g)
        g = re.sub(
            r'^(block|blocks\.)\d+\.(\d+\.)?',
            lambda m: m.group(1) + '*.' + ('*.' if m.group(2) else ''),
            g,
        )
        g = re.sub(r'^(patch_embed|pos_embed)\d+', r'\1*', g)
        counts[g] = counts.get(g, 0) + 1
    return [f'{g} (x{n})' if n > 1 else g for g, n in counts.items()]


def format_summary(
    result: ConversionResult,
    title: str,
    verbose: bool = False,
    more_hint: str = 'verbose=True lists all',
) -> str:
    """Human-readable report of a conversion: ``title``, then what was loaded, new and
    unused. A partial conversion (a pyramid from another model) groups the keys by
    stage and block (``verbose``: every key; otherwise long lists are cut, with
    ``more_hint`` saying how to see them whole) and tells the replaced attention from
    the rest; a whole-model one (``result.whole_model``) lists its exceptions, the new
    and unused keys, in full."""

    def block(name, keys, listing='grouped', values=True):
        n = sum(result.sizes.get(k, 0) for k in keys) if values else 0
        head = f'{name}: {len(keys)} tensors' + (f' ({n:,} values)' if n else '')
        if listing == 'none':
            return head
        items = list(keys) if verbose or listing == 'all' else _group(keys)
        if not verbose and listing == 'grouped' and len(items) > 16:
            items = items[:16] + [f'... {len(items) - 16} more ({more_hint})']
        return '\n'.join([head] + [f'    {s}' for s in items])

    if result.whole_model:
        return '\n'.join(
            [
                title,
                block('loaded', result.loaded, 'none'),
                block('new (not in the checkpoint)', result.new, 'all', values=False),
                block('unused (in the checkpoint, not loaded)', result.unused, 'all', values=False),
            ]
        )
    lines = [title, block('loaded', result.loaded)]
    if result.resized:
        lines.append(block('resized (position tables)', result.resized))
    if result.from_model:
        lines.append(block('buffers taken from the model', result.from_model))
    lines.append(block('new: replaced attention, left to the model init', result.new_attention))
    if result.new_other:
        lines.append(block('new: other, not in the source', result.new_other))
    lines.append(block('unused from the source', result.unused))
    return '\n'.join(lines)


def save_checkpoint(result: ConversionResult, path: str) -> str:
    """Write ``{'state_dict': ..., 'meta': ...}`` to ``path`` atomically
    (:func:`mmcirc.utils.fileio.atomic_open`); returns ``path``."""
    from mmcirc.utils.fileio import atomic_open

    path = osp.expanduser(path)
    with atomic_open(path, 'wb') as f:
        torch.save({'state_dict': result.state_dict, 'meta': result.meta}, f)
    return path
