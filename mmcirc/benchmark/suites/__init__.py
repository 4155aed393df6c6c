"""The benchmark suites: each measures its cases over the harness and writes its results
and tables (``run(options)``); ``python -m mmcirc.benchmark SUITE`` is their command
(:mod:`mmcirc.benchmark.command`, one parser), ``SUITE --help`` lists the flags.

=================  ==========================================
suite              what
=================  ==========================================
``attention``      one attention layer vs N (+ CPU targets)
``backbone``       pyramids vs mmdet / mmseg PVT-S, Swin-T
``isotropic``      CA-DeiT / VECA vs DeiT / ViT
``compile``        eager vs torch.compile per family
``compile_train``  toy training, eager vs compiled backbone
``gpu``            CA-DeiT-T vs DeiT-T, precisions, compile
``sharded``        sharded whole-image inference vs P = 1
``launches``       ops per eager forward, host time vs peers
``kernel``         the Triton core vs FFT path vs SDPA (GPU)
=================  ==========================================

``python -m mmcirc.benchmark docs`` runs the suites of the documentation's tables and
rewrites them (:mod:`mmcirc.benchmark.docs`).
"""
