"""Parameters and FLOPs (multiply-adds) of a config's model, per backbone stage.

python tools/analysis/get_flops.py CONFIG [--shape H [W] | --num-images N] [--mode backbone]
"""

from mmcirc.cli.get_flops import main

if __name__ == '__main__':
    main()
