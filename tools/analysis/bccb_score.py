"""How close are a model's attention matrices to BCCB (block-circulant) matrices?

    python tools/analysis/bccb_score.py CONFIG [CHECKPOINT] (--img PATH | --demo astronaut)
        [--size HxW] [--head 0] [--seed 0] [--out-dir work_dirs/analysis/bccb_score]

The entry point of :mod:`mmcirc.cli.bccb_score` (what the command computes and
writes is described there; ``--help`` lists the flags).
"""

import sys
import warnings

warnings.filterwarnings('ignore', message='.*pkg_resources.*')  # mmengine's import
from mmcirc.cli.bccb_score import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
