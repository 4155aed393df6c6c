"""Convert a PVT v1 checkpoint to CA-PVT / Core-PVT (mmcirc.models.convert).

Reads the official release (github.com/whai362/PVT: ``patch_embed1.proj``,
``pos_embed1``, ``block1.0.attn.q/kv/sr``, ``norm``, ``head``) or an mmdet
``PyramidVisionTransformer`` checkpoint (e.g. a whole detector, ``backbone.`` keys),
detected automatically. Loads patch/position embeddings, norms, every stage's MLP and
the spatial-reduction attention of the stages that keep it; reports the circulant /
core attention left new and what of the source went unused; writes
``{'state_dict', 'meta'}`` atomically.

    python tools/model_converters/pvt_to_mmcirc.py pvt_small.pth --arch small
        # -> work_dirs/pretrained/ca_pvt_s_in1k.pth
    python tools/model_converters/pvt_to_mmcirc.py pvt_tiny.pth out.pth --attention core
    python tools/model_converters/pvt_to_mmcirc.py pvt_small.pth --arch small \\
        --stage-attentions circulant circulant circulant sra --pos-embed-size 512
"""
import argparse
import sys

import _cli  # sibling module: tools/model_converters/_cli.py


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='PVT v1 checkpoint -> CA-PVT / Core-PVT')
    parser.add_argument('src', help='source checkpoint (official PVT v1 or mmdet layout)')
    parser.add_argument('out', nargs='?',
                        help='output path (default work_dirs/pretrained/<variant>_in1k.pth)')
    parser.add_argument('--arch', default='tiny',
                        help="tiny, small, medium, large, or a dict literal "
                             "\"{'embed_dims': [...], 'depths': [...], 'num_heads': [...]}\"")
    _cli.add_target_args(parser)
    parser.add_argument('--src-layout', default='auto', choices=['auto', 'official', 'mmdet', 'mmcirc'])
    parser.add_argument('--pos-embed-size', type=int, metavar='PX',
                        help='image size the target position tables are stored for; source '
                             'tables of another size are resized (bilinear)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    return _cli.run('pvt', args, [args.src])


if __name__ == '__main__':
    sys.exit(main())
