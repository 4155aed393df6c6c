"""Convert a released VECA checkpoint (github.com/alansong1322/VECA) for mmcirc's
:class:`VECAViT` (mmcirc.models.backbones.veca_convert).

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

import sys

from mmcirc.cli.convert import veca_main as main

if __name__ == '__main__':
    sys.exit(main())
