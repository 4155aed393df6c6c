"""Evaluate a checkpoint on an mmdet, mmseg or mmpretrain config's test set.

python tools/test.py CONFIG CHECKPOINT [--out FILE] [--show] [--show-dir DIR] [--wait-time S] [--tta] [--work-dir DIR] [--compile [BACKEND]] [--trust-checkpoint] [--num-cores N] [--cfg-options k=v ...]
"""

from mmcirc.cli.test import main

if __name__ == '__main__':
    main()
