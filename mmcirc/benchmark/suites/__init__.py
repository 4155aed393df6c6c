"""The benchmark suites: each measures its cases over the harness and writes its results
and tables (``run(options)``); its command line is ``mmcirc.cli.benchmark_<suite>``,
whose entry points are the thin tools in ``tools/analysis`` and ``tools/deployment``.

=================  ==========================================  ====================================
suite              what                                        tool
=================  ==========================================  ====================================
``attention``      one attention layer vs N (+ CPU targets)    analysis/benchmark_attention.py
``backbone``       pyramids vs mmdet / mmseg PVT-S, Swin-T     analysis/benchmark_backbone.py
``isotropic``      CA-DeiT / VECA vs DeiT / ViT                analysis/benchmark_isotropic.py
``compile``        eager vs torch.compile per family           analysis/benchmark_compile.py
``compile_train``  toy training, eager vs compiled backbone    analysis/benchmark_compile_train.py
``gpu``            CA-DeiT-T vs DeiT-T, precisions, compile    deployment/benchmark_gpu.py
``sharded``        sharded whole-image inference vs P = 1      analysis/benchmark_sharded.py
``launches``       ops per eager forward, host time vs peers   analysis/benchmark_launches.py
``kernel``         the Triton core vs FFT path vs SDPA (GPU)   deployment/benchmark_kernel.py
=================  ==========================================  ====================================

``python -m mmcirc.benchmark docs`` (``tools/analysis/benchmark_docs.py``) runs the suites
of the documentation's tables and rewrites them (:mod:`mmcirc.benchmark.docs`).
"""

SUITES = (
    'attention',
    'backbone',
    'isotropic',
    'compile',
    'compile_train',
    'gpu',
    'sharded',
    'launches',
    'kernel',
)
