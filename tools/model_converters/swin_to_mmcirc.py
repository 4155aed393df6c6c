"""Convert a Swin checkpoint (official or OpenMMLab) to CA-Swin / Core-Swin.

python tools/model_converters/swin_to_mmcirc.py swin_tiny_patch4_window7_224.pth
"""

from mmcirc.cli.convert import swin_main as main

if __name__ == '__main__':
    main()
