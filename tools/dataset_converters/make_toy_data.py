"""Generate mmcirc's deterministic toy datasets (COCO, ADE20K and ImageNet layouts).

Examples::

    python tools/dataset_converters/make_toy_data.py                 # all three into data/
    python tools/dataset_converters/make_toy_data.py coco --num-train 400 --num-val 80
    python tools/dataset_converters/make_toy_data.py ade imagenet --out /tmp/toy --seed 1
    python tools/dataset_converters/make_toy_data.py coco --img-size 128x160  # H x W
"""

from mmcirc.cli.make_toy_data import main

if __name__ == '__main__':
    main()
