"""Convert a released VECA checkpoint for mmcirc's VECAViT.

python tools/model_converters/veca_to_mmcirc.py veca_base.pt
"""

from mmcirc.cli.convert import veca_main as main

if __name__ == '__main__':
    main()
