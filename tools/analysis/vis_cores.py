"""Which patches each core gathers from, per core-attention layer and core budget C'.

python tools/analysis/vis_cores.py CONFIG [CHECKPOINT] (--img PATH | --demo NAME) [--num-cores 8 16]
"""

from mmcirc.cli.vis_cores import main

if __name__ == '__main__':
    main()
