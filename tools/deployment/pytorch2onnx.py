"""Export an mmdet / mmseg / mmpretrain model of mmcirc to ONNX.

    python tools/deployment/pytorch2onnx.py CONFIG [CHECKPOINT] --shape H W --out FILE.onnx
        [--dynamic [--size-divisor 32]] [--verify] [--features] [--opset 18]
        [--cfg-options k=v ...]

The entry point of :mod:`mmcirc.cli.pytorch2onnx` (what the graph holds, what
``--dynamic`` and ``--verify`` do: there; ``--help`` lists the flags).
"""

from mmcirc.cli.pytorch2onnx import main

if __name__ == '__main__':
    main()
