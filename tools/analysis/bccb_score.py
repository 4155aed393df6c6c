"""How close are a model's attention matrices to BCCB (block-circulant) matrices?

python tools/analysis/bccb_score.py CONFIG [CHECKPOINT] (--img PATH | --demo astronaut) [--size HxW]
"""

from mmcirc.cli.bccb_score import main

if __name__ == '__main__':
    main()
