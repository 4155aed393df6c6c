"""Check that mmcv's CUDA kernels that mmdet calls on a GPU run and agree with the CPU.

python tools/misc/check_mmcv_cuda.py
"""

from mmcirc.cli.check_mmcv_cuda import main

if __name__ == '__main__':
    main()
