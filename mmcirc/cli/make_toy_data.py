"""Generate mmcirc's deterministic toy datasets (COCO, ADE20K and ImageNet layouts).

``tools/dataset_converters/make_toy_data.py`` (``mim run mmcirc make_toy_data``) writes
``<out>/toy_coco``, ``<out>/toy_ade/ADEChallengeData2016`` and ``<out>/toy_imagenet``; see
:mod:`mmcirc.datasets.toy_data` for the layouts and the class names/palettes to put in
config ``metainfo``.
"""

import argparse
import time

from mmcirc.cli.common import check_output_dir, main_guard
from mmcirc.datasets import toy_data


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Generate deterministic toy datasets of coloured shapes.'
    )
    parser.add_argument(
        'datasets',
        nargs='*',
        default=['all'],
        metavar='DATASET',
        help='one or more of: coco, ade, imagenet, all (default: all)',
    )
    parser.add_argument('--out', default='data', help='output parent directory (default: data)')
    parser.add_argument('--seed', type=int, default=0, help='random seed (default: 0)')
    for flag, what, n in (
        ('--num-train', 'training', toy_data.DEFAULT_NUM_TRAIN),
        ('--num-val', 'validation', toy_data.DEFAULT_NUM_VAL),
    ):
        parser.add_argument(
            flag, type=int, default=n, help=f'{what} images per dataset (default: {n})'
        )
    parser.add_argument(
        '--img-size',
        help="image size 'S' or 'HxW' for every selected dataset (default: "
        + ', '.join(f'{k} {h}x{w}' for k, (h, w) in toy_data.DEFAULT_IMG_SIZES.items())
        + ')',
    )
    return parser.parse_args(argv)


@main_guard
def main(argv=None):
    args = parse_args(argv)
    check_output_dir(args.out, '--out')
    start = time.perf_counter()
    summaries = toy_data.make_toy_data(
        args.datasets, args.out, args.num_train, args.num_val, args.img_size, args.seed
    )
    for name, s in summaries.items():
        counts = ', '.join(
            f'{split} {s[split]["images"]} images'
            + (f', {s[split]["annotations"]} annotations' if 'annotations' in s[split] else '')
            for split in ('train', 'val')
        )
        print(f'{name:9s} -> {s["root"]}: {counts}')
    print(f'done in {time.perf_counter() - start:.2f}s')
