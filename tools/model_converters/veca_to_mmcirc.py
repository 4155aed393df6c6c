"""Convert a released VECA checkpoint (github.com/alansong1322/VECA) for mmcirc's
:class:`VECAViT` (mmcirc.models.convert_isotropic).

The file as downloaded: ``{'student': state_dict, 'config': {...}, ...}`` (optimizer
states and the rest are ignored; ``module.`` / ``student.`` key prefixes are removed).
The arch comes from ``config['model_family']`` (small, splus, base, large); the core
bank chunks become one bank. It is read with mmcirc's safe loader (tensors and plain
containers only; the official loader unpickles everything). Every tensor is loaded;
the report lists anything new or unused. The output holds ``backbone.*`` keys and, in
``meta['backbone']``, the VECAViT arguments the checkpoint's config implies.

    python tools/model_converters/veca_to_mmcirc.py veca_base.pt
        # -> work_dirs/pretrained/veca_base_official.pth
"""

import argparse
import sys

import _cli  # sibling module: tools/model_converters/_cli.py

from mmcirc.utils.cli import main_guard


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='VECA checkpoint -> mmcirc VECAViT')
    parser.add_argument('src', help="official VECA checkpoint ({'student': ..., 'config': ...})")
    parser.add_argument(
        'out',
        nargs='?',
        help='output path (default work_dirs/pretrained/veca_<family>_official.pth)',
    )
    parser.add_argument(
        '--arch',
        default=None,
        help="override the config's model_family: small, splus, base, large or a dict literal "
        'with embed_dims, num_layers, num_heads, mlp_ratio, num_cores',
    )
    parser.add_argument(
        '--trust-checkpoint',
        action='store_true',
        help='allow full unpickling of the source (only for files you trust)',
    )
    return parser.parse_args(argv)


@main_guard
def main(argv=None):
    args = parse_args(argv)
    return _cli.run_isotropic('veca', args, [args.src])


if __name__ == '__main__':
    sys.exit(main())
