"""Export an mmdet / mmseg / mmpretrain model of mmcirc to ONNX.

python tools/deployment/pytorch2onnx.py CONFIG [CHECKPOINT] --shape H W --out FILE.onnx [--verify]
"""

from mmcirc.cli.pytorch2onnx import main

if __name__ == '__main__':
    main()
