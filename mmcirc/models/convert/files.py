"""A checkpoint file converted to a file, for any family (:func:`convert_file`): the
dispatcher above the family converters, which it finds in the family table (their
``convert`` column, :func:`mmcirc.models.families.converters`)."""

import os.path as osp
from functools import partial
from typing import Optional

from ..families import converters
from .conversion import ConversionError, load_source, save_checkpoint

__all__ = ['convert_file']


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
    """Convert the checkpoint file ``src`` for a ``family`` model (its converter)
    and save it atomically to ``out`` (default: the family's name under
    :data:`OUTPUT_ROOT`, named by the options that change the weights). ``out`` naming a
    file read (``src``, ``base``) is refused before anything is read; an existing
    default output is refused unless ``overwrite`` (an ``out`` given is the caller's
    to overwrite).

    ``trust`` allows full unpickling of the files read (:func:`load_source`);
    ``options`` are the family's converter's (:func:`.pyramid.convert_source` for
    ``'pvt'`` / ``'swin'``, ``arch`` for the released ``'deit'`` / ``'veca'`` files).
    Returns ``(result, out, title)`` (a one-line description for :func:`format_summary`);
    :class:`ConversionError` names the parameter or tensor that does not fit.
    """
    for name, path in (('src', src), ('base', options.get('base'))):
        if _same_file(out, path):
            raise ConversionError(
                f'out {out} is the {name} checkpoint: the output must be another file'
            )
    convert = converters()
    if family not in convert:
        raise ConversionError(f'family must be one of {tuple(convert)}, got {family!r}')
    load = partial(load_source, trust=trust)
    result, default_out, title = convert[family](
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
