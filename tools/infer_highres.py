"""Whole-image semantic segmentation at high resolution (e.g. 4096 x 4096) with an
mmseg config, timing it and measuring its peak memory.

    python tools/infer_highres.py CONFIG [CHECKPOINT] (--img PATH [PATH ...] | --demo astronaut)
        [--size S | --size HxW] [--num-cores N|mobile|edge|server] [--boundary circular|zero]
        [--scale sqrt_n|n] [--stage-attentions KIND[,KIND...]] [--out-dir work_dirs/highres]
        [--device cpu] [--opacity 0.5] [--upsample banded|mmseg] [--cfg-options k=v ...]
        [--dense-baseline | --baseline-only] [--mem-cap-gb 20] [--baseline-timeout 1800]
        [--progress | --no-progress] [--shard | --nproc P] [--allow-partial-weights]
        [--trust-checkpoint]
    torchrun --nproc-per-node P tools/infer_highres.py CONFIG [CHECKPOINT] ... --shard

The entry point of :mod:`mmcirc.cli.infer_highres` (the outputs, the overrides and the
sharded mode are described there; ``--help`` lists the flags).
"""

import sys

from mmcirc.cli.infer_highres import main

if __name__ == '__main__':
    sys.exit(main())
