"""Initialise the circulant blocks of CA-Swin / CA-PVT from a CA-DeiT checkpoint
(github.com/LeapLabTHU/Circulant-Attention, ``models/ca_deit.py``; mmcirc.models.convert).

CA-DeiT is isotropic (width 192 / 384 / 768 for T / S / B): its blocks (CPE, norms,
gate, bias-free qkv, proj, MLP) fit only circulant blocks of the same width, which
are filled in order from CA-DeiT block 0 (or ``--source-blocks``). With the paper's
layout only CA-Swin-T/S stage 2 (width 192) fits, from CA-DeiT-T; CA-DeiT-S (384) and
-B (768) fit Swin-T/S stages 3 / 4 once they are circulant; no PVT or Swin-B stage
has a DeiT width. ``--base`` starts from a checkpoint in mmcirc's layout (e.g. the
output of swin_to_mmcirc.py) so that the rest of the backbone is initialised too.

    python tools/model_converters/swin_to_mmcirc.py swin_tiny.pth base.pth
    python tools/model_converters/cadeit_to_mmcirc.py ca_deit_tiny.pth \\
        work_dirs/pretrained/ca_swin_t_in1k.pth --base base.pth
    python tools/model_converters/cadeit_to_mmcirc.py ca_deit_small.pth --arch tiny \\
        --stage-attentions circulant circulant circulant window
        # -> work_dirs/pretrained/swin_t_circulant-circulant-circulant-window_ca-deit-s.pth

``--family deit`` converts the released CA-DeiT file itself (``{'model': state_dict}``)
for mmcirc's :class:`CADeiT` plus mmpretrain's ``LinearClsHead`` (keys ``backbone.*``,
``head.fc.*``; arch read from the tensors, ``--arch`` only checks it); every tensor is
loaded, nothing is new or unused (mmcirc.models.convert_isotropic):

    python tools/model_converters/cadeit_to_mmcirc.py ca_deit_small.pth --family deit
        # -> work_dirs/pretrained/ca_deit_s_official.pth
"""

import argparse
import sys

import _cli  # sibling module: tools/model_converters/_cli.py

from mmcirc.utils.cli import CLIError, main_guard


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='CA-DeiT checkpoint -> circulant blocks of CA-Swin / CA-PVT'
    )
    parser.add_argument('src', help='CA-DeiT checkpoint (timm layout, optionally under "model")')
    parser.add_argument(
        'out',
        nargs='?',
        help='output path (default work_dirs/pretrained/<variant>_ca-deit-<t|s|b>.pth)',
    )
    parser.add_argument(
        '--family',
        default='swin',
        choices=['swin', 'pvt', 'deit'],
        help='target pyramid, or deit: the CA-DeiT model itself (CADeiT)',
    )
    parser.add_argument(
        '--arch',
        default=None,
        help='target arch name or dict literal (default tiny; deit: read from the checkpoint)',
    )
    _cli.add_target_args(parser)
    parser.add_argument(
        '--source-blocks',
        nargs='+',
        type=int,
        metavar='K',
        help='CA-DeiT blocks to use, in order (default 0 1 2 ...)',
    )
    parser.add_argument('--base', help='checkpoint in mmcirc layout that supplies everything else')
    return parser.parse_args(argv)


@main_guard
def main(argv=None):
    args = parse_args(argv)
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
        return _cli.run_isotropic('deit', args, [args.src])
    args.arch = args.arch or 'tiny'
    return _cli.run(args.family, args, [args.src, args.base], cadeit=True)


if __name__ == '__main__':
    sys.exit(main())
