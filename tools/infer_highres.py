"""Whole-image semantic segmentation at high resolution, timed and its peak memory measured.

python tools/infer_highres.py CONFIG [CHECKPOINT] (--img PATH [PATH ...] | --demo NAME) [--size S]
torchrun --nproc-per-node P tools/infer_highres.py CONFIG [CHECKPOINT] ... --shard
"""

from mmcirc.cli.infer_highres import main

if __name__ == '__main__':
    main()
