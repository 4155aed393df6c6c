"""Convert a PVT v1 checkpoint (official or mmdet) to CA-PVT / Core-PVT.

python tools/model_converters/pvt_to_mmcirc.py pvt_small.pth --arch small
"""

from mmcirc.cli.convert import pvt_main as main

if __name__ == '__main__':
    main()
