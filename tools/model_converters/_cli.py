"""What the converter CLIs share: the target-model options, reading them into the
arguments of :func:`mmcirc.models.convert.convert_file` /
:func:`mmcirc.models.convert_isotropic.convert_isotropic_file`, a check that the
inputs exist before the slow imports, and failures as one ``error:`` line (exit 1,
:func:`mmcirc.utils.cli.main_guard`).

Import it as a sibling module (``import _cli``: a script's own folder is on ``sys.path``).
"""

import argparse
import ast
import os.path as osp

from mmcirc.utils.cli import CLIError, main_guard

#: The other released kind's tool, for a CA-DeiT file given to VECA's and vice versa.
_KIND_TOOLS = {
    'cadeit': 'tools/model_converters/cadeit_to_mmcirc.py --family deit',
    'veca': 'tools/model_converters/veca_to_mmcirc.py',
}


def pyramid_main(family, description, src_help, arch_help, add_args=None):
    """``main(argv=None)`` of a PVT / Swin converter: SRC [OUT] --arch ... (the target
    options of :func:`add_target_args`) --src-layout {auto, the family's layouts}, and
    what ``add_args(parser)`` adds; converts with :func:`run`."""
    from mmcirc.models.convert import LAYOUTS

    def parse_args(argv=None):
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument('src', help=src_help)
        parser.add_argument(
            'out', nargs='?', help='output path (default work_dirs/pretrained/<variant>_in1k.pth)'
        )
        parser.add_argument('--arch', default='tiny', help=arch_help)
        add_target_args(parser)
        parser.add_argument('--src-layout', default='auto', choices=('auto',) + LAYOUTS[family])
        if add_args is not None:
            add_args(parser)
        return parser.parse_args(argv)

    @main_guard
    def main(argv=None):
        args = parse_args(argv)
        return run(family, args, [args.src])

    return main


def add_target_args(parser):
    """Options every converter takes: the target's attention layout, extra target
    arguments, trust and verbosity. The attention kinds are those of the registered
    blocks that fit the target family (checked when the target is built, so that
    ``--help`` does not import the libraries)."""
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
        metavar='KIND',
        help='per-stage attention instead: one kind for every stage or one per stage '
        '(the registered block kinds of the family)',
    )
    parser.add_argument(
        '--backbone-options',
        nargs='+',
        metavar='KEY=VALUE',
        help='extra target arguments, e.g. num_cores_max=32',
    )
    parser.add_argument(
        '--trust-checkpoint',
        action='store_true',
        help='allow full unpickling of the sources (only for files you trust)',
    )
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


def check_files(paths):
    """Every given path is a file (before the slow imports)."""
    for path in paths:
        if path is not None and not osp.isfile(path):
            raise CLIError(f'checkpoint not found: {path}')


def _converted(convert, summarize, **kwargs):
    """``convert(**kwargs)`` (a ``convert_*file`` function), then print
    ``summarize(result, title)`` and the path; library errors become CLIError."""
    from mmcirc.models.convert import ConversionError
    from mmcirc.models.convert_isotropic import CheckpointKindError

    try:
        result, out, title = convert(**kwargs)
    except CheckpointKindError as err:
        raise CLIError(f'{err}: use {_KIND_TOOLS[err.found]}') from None
    except ConversionError as err:
        raise CLIError(str(err)) from None
    print(summarize(result, title))
    print(f'saved {out}')
    return result


def run(family, args, paths, cadeit=False):
    """Convert a PVT / Swin (or, with ``cadeit``, a CA-DeiT) checkpoint for a
    ``family`` pyramid from the parsed flags; return the exit code (0)."""
    check_files(paths)
    from mmcirc.models.convert import convert_file, format_summary

    kinds = args.stage_attentions
    if kinds is not None and len(kinds) == 1:
        kinds = kinds[0]  # one kind for every stage

    def summarize(result, title):
        return format_summary(result, title, verbose=args.verbose, more_hint='--verbose lists all')

    _converted(
        convert_file,
        summarize,
        family=family,
        src=args.src,
        out=args.out,
        arch=parse_arch(args.arch),
        attention=args.attention,
        stage_attentions=kinds,
        backbone_options=parse_backbone_options(getattr(args, 'backbone_options', None)),
        pos_embed_size=getattr(args, 'pos_embed_size', None),
        src_layout=getattr(args, 'src_layout', 'auto'),
        trust=args.trust_checkpoint,
        cadeit=cadeit,
        source_blocks=getattr(args, 'source_blocks', None),
        base=getattr(args, 'base', None),
    )
    return 0


def run_isotropic(kind, args, paths):
    """Convert an official CA-DeiT (``kind='deit'``) or VECA (``'veca'``) checkpoint
    from the parsed flags; return the exit code (0)."""
    check_files(paths)
    from mmcirc.models.convert_isotropic import convert_isotropic_file, format_isotropic_summary

    _converted(
        convert_isotropic_file,
        format_isotropic_summary,
        kind=kind,
        src=args.src,
        out=args.out,
        arch=parse_arch(args.arch),
        trust=getattr(args, 'trust_checkpoint', False),
    )
    return 0
