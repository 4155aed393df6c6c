"""Which patches each core gathers from, per core-attention layer and core budget C'.

    python tools/analysis/vis_cores.py CONFIG [CHECKPOINT] (--img PATH | --demo astronaut)
        [--num-cores 8 16 64] [--size HxW] [--show 8] [--out-dir work_dirs/analysis/vis_cores]

The entry point of :mod:`mmcirc.cli.vis_cores` (what the command computes and
writes is described there; ``--help`` lists the flags).
"""

import sys
import warnings

warnings.filterwarnings('ignore', message='.*pkg_resources.*')  # mmengine's import
from mmcirc.cli.vis_cores import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
