"""The converter command lines: ``tools/model_converters/*_to_mmcirc.py`` run
:func:`pyramid_main` (``pvt_main``, ``swin_main``), :func:`cadeit_main` and :func:`veca_main`,
which read their options into the arguments of :func:`mmcirc.models.convert.convert_file`
(:func:`_convert`). An existing default output is overwritten only with ``--force``.
"""

import argparse
import ast
import functools
import os.path as osp

from mmcirc.cli.common import Accumulate, CLIError, add_trust_flag, main_guard, refused_checkpoints

#: The other released kind's tool, for a CA-DeiT file given to VECA's and vice versa.
_KIND_TOOLS = {
    'cadeit': 'tools/model_converters/cadeit_to_mmcirc.py --family deit',
    'veca': 'tools/model_converters/veca_to_mmcirc.py',
}


def add_target_args(parser):
    """Options every pyramid converter takes: the target's attention layout, extra
    target arguments, trust and verbosity. The attention kinds are those of the
    registered blocks that fit the target family (checked when the target is built, so
    that ``--help`` does not import the libraries)."""
    parser.add_argument(
        '--attention',
        default='circulant',
        metavar='KIND',
        help='attention of stages 1-2 (the paper layout): circulant (default), core, '
        'or any registered block kind of the family',
    )
    parser.add_argument(
        '--stage-attentions',
        nargs='+',
        action=Accumulate,
        metavar='KIND',
        help='per-stage attention instead: one kind for every stage or one per stage '
        '(the registered block kinds of the family)',
    )
    parser.add_argument(
        '--backbone-options',
        nargs='+',
        action=Accumulate,
        metavar='KEY=VALUE',
        help='extra target arguments, e.g. num_cores_max=32',
    )
    add_trust_flag(parser, 'the sources')
    parser.add_argument('--verbose', action='store_true', help='list every key')


def parse_value(text: str):
    """A Python literal (number, tuple, dict, ...), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_arch(text):
    """``--arch``: a name, or a dict literal when it starts with ``{``."""
    if isinstance(text, str) and text.lstrip().startswith('{'):
        return parse_value(text)
    return text


def parse_backbone_options(items) -> dict:
    """``--backbone-options key=value ...`` -> dict (values read as Python literals)."""
    opts = {}
    for item in items or ():
        if '=' not in item:
            raise CLIError(f'--backbone-options takes key=value, got {item!r}')
        key, value = item.split('=', 1)
        opts[key.strip()] = parse_value(value)
    return opts


def add_output_args(parser, default: str):
    """``OUT`` (optional: ``default``, named by the options) and ``--force``."""
    parser.add_argument('out', nargs='?', help=f'output path (default {default})')
    parser.add_argument(
        '--force',
        action='store_true',
        help='overwrite the default output when it exists (OUT given: always written)',
    )


def _convert(family, args, paths, **options):
    """Check that ``paths`` exist and that OUT is none of them, convert ``args.src``
    for ``family`` (:func:`~mmcirc.models.convert.convert_file`), print the report and
    the path; library errors become :class:`CLIError`. Returns the exit code (0)."""
    for path in filter(None, paths):
        if not osp.isfile(path):
            raise CLIError(f'checkpoint not found: {path}')
        if args.out is not None and osp.exists(args.out) and osp.samefile(path, args.out):
            raise CLIError(f'OUT {args.out} is the input {path}: name another output file')
    if args.out is not None and osp.isdir(args.out):
        raise CLIError(f'OUT {args.out} is a folder: name the output file')
    from mmcirc.models.convert import (
        CheckpointKindError,
        ConversionError,
        convert_file,
        format_summary,
    )

    try:
        with refused_checkpoints('--trust-checkpoint'):
            result, out, title = convert_file(
                family,
                args.src,
                args.out,
                trust=args.trust_checkpoint,
                overwrite=args.force,
                arch=parse_arch(args.arch),
                **options,
            )
    except CheckpointKindError as err:
        raise CLIError(f'{err}: use {_KIND_TOOLS[err.found]}') from None
    except ConversionError as err:  # a multi-line message (tensor list, hint) on one line
        first, *rest = str(err).splitlines() or ['']
        raise CLIError(' '.join([first] + ['; '.join(r.strip() for r in rest)]).strip()) from None
    print(
        format_summary(
            result, title, verbose=getattr(args, 'verbose', False), more_hint='--verbose lists all'
        )
    )
    print(f'saved {out}')
    return 0


def _pyramid_options(args, cadeit=False) -> dict:
    """The :func:`~mmcirc.models.convert.pyramid.convert_source` options of
    the parsed flags."""
    kinds = args.stage_attentions
    if kinds is not None and len(kinds) == 1:
        kinds = kinds[0]  # one kind for every stage
    options = dict(
        attention=args.attention,
        stage_attentions=kinds,
        backbone_options=parse_backbone_options(args.backbone_options),
    )
    if cadeit:
        return dict(options, cadeit=True, source_blocks=args.source_blocks, base=args.base)
    return dict(
        options, pos_embed_size=getattr(args, 'pos_embed_size', None), src_layout=args.src_layout
    )


#: The pyramid converters' sources: (description, SRC help, --arch help).
PYRAMID_SOURCES = {
    'pvt': (
        'PVT v1 checkpoint -> CA-PVT / Core-PVT',
        'source checkpoint (official PVT v1 or mmdet layout)',
        'tiny, small, medium, large, or a dict literal '
        "\"{'embed_dims': [...], 'depths': [...], 'num_heads': [...]}\"",
    ),
    'swin': (
        'Swin checkpoint -> CA-Swin / Core-Swin',
        'source checkpoint (official Swin, mmdet/mmseg/mmpretrain layout)',
        'tiny, small, base, or a dict literal '
        "\"{'embed_dims': 96, 'depths': [...], 'num_heads': [...]}\"",
    ),
}


@main_guard
def pyramid_main(family, argv=None):
    """``{pvt,swin}_to_mmcirc.py``: SRC [OUT] --arch ... (:func:`add_target_args`)
    --src-layout {auto, the family's layouts} -> CA-/Core- pyramid of ``family``."""
    from mmcirc.models.convert.pyramid import layouts_of

    description, src_help, arch_help = PYRAMID_SOURCES[family]
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('src', help=src_help)
    add_output_args(parser, 'work_dirs/pretrained/<variant>[_<backbone options>]_in1k.pth')
    parser.add_argument('--arch', default='tiny', help=arch_help)
    add_target_args(parser)
    parser.add_argument('--src-layout', default='auto', choices=('auto',) + layouts_of(family))
    if family == 'pvt':
        parser.add_argument(
            '--pos-embed-size',
            type=int,
            metavar='PX',
            help='image size the target position tables are stored for; source '
            'tables of another size are resized (bilinear)',
        )
    args = parser.parse_args(argv)
    return _convert(family, args, [args.src], **_pyramid_options(args))


pvt_main = functools.partial(pyramid_main, 'pvt')
swin_main = functools.partial(pyramid_main, 'swin')


@main_guard
def cadeit_main(argv=None):
    """``cadeit_to_mmcirc.py``: a CA-DeiT checkpoint -> the circulant blocks of a
    CA-Swin / CA-PVT, or (``--family deit``) the CA-DeiT itself."""
    parser = argparse.ArgumentParser(
        description='CA-DeiT checkpoint -> circulant blocks of CA-Swin / CA-PVT'
    )
    parser.add_argument('src', help='CA-DeiT checkpoint (timm layout, optionally under "model")')
    add_output_args(parser, 'work_dirs/pretrained/<variant>[_<options>]_ca-deit-<t|s|b>.pth')
    parser.add_argument(
        '--family',
        default='swin',
        choices=['swin', 'pvt', 'deit'],
        help='target pyramid, or deit: the CA-DeiT model itself (CADeiT)',
    )
    parser.add_argument(
        '--arch',
        help='target arch name or dict literal (default tiny; deit: read from the checkpoint)',
    )
    add_target_args(parser)
    parser.add_argument(
        '--source-blocks',
        nargs='+',
        action=Accumulate,
        type=int,
        metavar='K',
        help='CA-DeiT blocks to use, in order (default 0 1 2 ...)',
    )
    parser.add_argument('--base', help='checkpoint in mmcirc layout that supplies everything else')
    args = parser.parse_args(argv)
    if args.family == 'deit':
        extra = [
            f'--{k.replace("_", "-")}'
            for k in ('stage_attentions', 'backbone_options', 'source_blocks', 'base')
            if getattr(args, k) is not None
        ] + (['--attention'] if args.attention != 'circulant' else [])
        if extra:
            raise CLIError(
                f'{", ".join(extra)} do not apply to --family deit (the whole CA-DeiT is converted)'
            )
        return _convert('deit', args, [args.src])
    args.arch = args.arch or 'tiny'
    return _convert(args.family, args, [args.src, args.base], **_pyramid_options(args, cadeit=True))


@main_guard
def veca_main(argv=None):
    """``veca_to_mmcirc.py``: a released VECA checkpoint -> mmcirc's VECAViT."""
    parser = argparse.ArgumentParser(description='VECA checkpoint -> mmcirc VECAViT')
    parser.add_argument('src', help="official VECA checkpoint ({'student': ..., 'config': ...})")
    add_output_args(parser, 'work_dirs/pretrained/veca_<family>_official.pth')
    parser.add_argument(
        '--arch',
        help="override the config's model_family: small, splus, base, large or a dict literal "
        'with embed_dims, num_layers, num_heads, mlp_ratio, num_cores',
    )
    add_trust_flag(parser, 'the source')
    args = parser.parse_args(argv)
    return _convert('veca', args, [args.src])
