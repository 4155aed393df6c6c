"""The benchmark suites: each a command line (``main(argv)``) over the harness, the
thin tools in ``tools/analysis`` and ``tools/deployment`` are their entry points.

=============  ==========================================  ===============================
suite          what                                        tool
=============  ==========================================  ===============================
``attention``  one attention layer vs N (+ CPU targets)    analysis/benchmark_attention.py
``backbone``   pyramids vs mmdet / mmseg PVT-S, Swin-T     analysis/benchmark_backbone.py
``isotropic``  CA-DeiT / VECA vs DeiT / ViT                analysis/benchmark_isotropic.py
``compile``    eager vs torch.compile per family           analysis/benchmark_compile.py
``gpu``        CA-DeiT-T vs DeiT-T, precisions, compile    deployment/benchmark_gpu.py
``sharded``    sharded whole-image inference vs P = 1      analysis/benchmark_sharded.py
=============  ==========================================  ===============================
"""

SUITES = ('attention', 'backbone', 'isotropic', 'compile', 'gpu', 'sharded')
