"""Initialise CA-Swin / CA-PVT circulant blocks from a CA-DeiT checkpoint, or convert
CA-DeiT itself.

python tools/model_converters/cadeit_to_mmcirc.py ca_deit_tiny.pth OUT.pth --base base.pth
python tools/model_converters/cadeit_to_mmcirc.py ca_deit_small.pth --family deit
"""

from mmcirc.cli.convert import cadeit_main as main

if __name__ == '__main__':
    main()
