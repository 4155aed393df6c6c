"""The global kernels circulant attention learned, and the backbone's effective receptive
field.

python tools/analysis/vis_circulant.py CONFIG [CHECKPOINT] (--img PATH | --demo NAME) [--size HxW]
"""

from mmcirc.cli.vis_circulant import main

if __name__ == '__main__':
    main()
