"""Complexity vs resolution from measured FLOPs: one attention block and whole backbones.

python tools/analysis/plot_complexity.py [--dims 64] [--block-sides 14 28 ... 512] [--models pvt_s circ_pvt_s ...] [--sizes 224 512 1024 2048] [--out-dir DIR]
"""

from mmcirc.cli.plot_complexity import main

if __name__ == '__main__':
    main()
