"""A checkpoint file converted to a file, for any family (:func:`convert_file`): the
dispatcher above the family converters beside their backbones
(``mmcirc/models/backbones/*_convert.py``), which import only the shared
:mod:`.conversion`."""

import os.path as osp
from typing import Optional

from mmcirc.models.backbones import deit_convert, pyramid_convert, veca_convert
from .conversion import ConversionError, load_source, save_checkpoint

__all__ = ['CONVERTERS', 'convert_file']

#: family -> ``convert(src, load, meta, **options) -> (result, default_out, title)``, its
#: module's ``convert_source`` (looked up when called: a family module importing
#: :mod:`.conversion` may be the one that imports this module).
CONVERTERS = {
    'pvt': lambda *args, **kw: pyramid_convert.convert_source('pvt', *args, **kw),
    'swin': lambda *args, **kw: pyramid_convert.convert_source('swin', *args, **kw),
    'deit': lambda *args, **kw: deit_convert.convert_source(*args, **kw),
    'veca': lambda *args, **kw: veca_convert.convert_source(*args, **kw),
}


def _same_file(a: Optional[str], b: Optional[str]) -> bool:
    """Whether two paths name one file (links and ``~`` resolved)."""
    if a is None or b is None:
        return False
    a, b = (osp.realpath(osp.expanduser(p)) for p in (a, b))
    return a == b or (osp.exists(a) and osp.exists(b) and osp.samefile(a, b))


def convert_file(
    family: str,
    src: str,
    out: Optional[str] = None,
    *,
    trust=False,
    overwrite: bool = False,
    **options,
):
    """Convert the checkpoint file ``src`` for a ``family`` model (:data:`CONVERTERS`)
    and save it atomically to ``out`` (default: the family's name under
    :data:`OUTPUT_ROOT`, named by the options that change the weights). ``out`` naming a
    file read (``src``, ``base``) is refused before anything is read; an existing
    default output is refused unless ``overwrite`` (an ``out`` given is the caller's
    to overwrite).

    ``trust`` allows full unpickling of the files read (:func:`load_source`);
    ``options`` are the family's (its ``convert_source``): for ``'pvt'`` /
    ``'swin'`` the target (``arch``, ``attention``, ``stage_attentions``,
    ``backbone_options``, ``pos_embed_size``), ``src_layout``, or ``cadeit=True`` with
    ``source_blocks`` and ``base`` (a CA-DeiT source, see
    :func:`mmcirc.models.backbones.deit_convert.convert_cadeit`); for ``'deit'`` /
    ``'veca'`` (the released files) ``arch``.

    Returns ``(result, out, title)``: the :class:`ConversionResult`, the path written and
    a one-line description for :func:`format_summary`. Raises :class:`ConversionError`
    (a ``ValueError``) naming the parameter or tensor that does not fit.
    """
    for name, path in (('src', src), ('base', options.get('base'))):
        if _same_file(out, path):
            raise ConversionError(
                f'out {out} is the {name} checkpoint: the output must be another file'
            )
    if family not in CONVERTERS:
        raise ConversionError(f'family must be one of {tuple(CONVERTERS)}, got {family!r}')

    def load(path):
        return load_source(path, trust=trust)

    result, default_out, title = CONVERTERS[family](
        src, load, dict(source=osp.basename(src)), **options
    )
    if out is None and osp.exists(osp.expanduser(default_out)) and not overwrite:
        raise ConversionError(
            f'{default_out} exists (the default output of these options): name an output '
            'file, or allow overwriting it (overwrite=True, --force)'
        )
    out = out or default_out
    save_checkpoint(result, out)
    return result, out, title
