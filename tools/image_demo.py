"""Paint a model's predictions on an image or a folder of images (mmdet's DetInferencer or
mmseg's MMSegInferencer, by the config's default_scope), as mmdet's demo/image_demo.py.

python tools/image_demo.py INPUTS CONFIG CHECKPOINT [--out-dir DIR] [--device cpu] [--pred-score-thr T | --opacity O] [--show] [--no-save-vis] [--no-save-pred] [--print-result] [--allow-partial-weights]
"""

from mmcirc.cli.image_demo import main

if __name__ == '__main__':
    main()
