"""Convert a Swin checkpoint to CA-Swin / Core-Swin (mmcirc.models.convert).

Reads the official release (github.com/microsoft/Swin-Transformer: ``patch_embed.proj``,
``layers.{i}.blocks.{j}.attn.*``, ``layers.{i}.downsample``, ``norm``, ``head``,
converted with mmdet's ``swin_converter``) or an mmdet / mmseg / mmpretrain Swin
checkpoint (same keys as mmcirc), detected automatically. Loads the patch embedding,
patch merging, norms, every stage's MLP and the window attention of the stages that
keep it; reports the circulant / core attention (and CPE) left new and what of the
source went unused (stage 1-2 window attention, head, attention masks); writes
``{'state_dict', 'meta'}`` atomically.

    python tools/model_converters/swin_to_mmcirc.py swin_tiny_patch4_window7_224.pth
        # -> work_dirs/pretrained/ca_swin_t_in1k.pth
    python tools/model_converters/swin_to_mmcirc.py swin_small.pth --arch small --attention core
"""
import argparse
import sys

import _cli  # sibling module: tools/model_converters/_cli.py


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Swin checkpoint -> CA-Swin / Core-Swin')
    parser.add_argument('src', help='source checkpoint (official Swin, mmdet/mmseg/mmpretrain layout)')
    parser.add_argument('out', nargs='?',
                        help='output path (default work_dirs/pretrained/<variant>_in1k.pth)')
    parser.add_argument('--arch', default='tiny',
                        help="tiny, small, base, or a dict literal "
                             "\"{'embed_dims': 96, 'depths': [...], 'num_heads': [...]}\"")
    _cli.add_target_args(parser)
    parser.add_argument('--src-layout', default='auto',
                        choices=['auto', 'official', 'mmdet', 'mmseg', 'mmpretrain', 'mmcirc'])
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    return _cli.run('swin', args, [args.src])


if __name__ == '__main__':
    sys.exit(main())
