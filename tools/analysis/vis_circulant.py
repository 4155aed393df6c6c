"""The global kernels circulant attention learned, and the backbone's effective
receptive field.

    python tools/analysis/vis_circulant.py CONFIG [CHECKPOINT] (--img PATH | --demo astronaut)
        [--size HxW] [--channels 16] [--overlay] [--erf-stages 0 1 2 3 | --no-erf]
        [--out-dir work_dirs/analysis/vis_circulant]

The entry point of :mod:`mmcirc.cli.vis_circulant` (what the command computes and
writes is described there; ``--help`` lists the flags).
"""

import sys
import warnings

warnings.filterwarnings('ignore', message='.*pkg_resources.*')  # mmengine's import
from mmcirc.cli.vis_circulant import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
