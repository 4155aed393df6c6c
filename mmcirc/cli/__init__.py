"""mmcirc's commands, one module per command: its parser, its ``main(argv)``, the one
``error:`` line and the exit code (:mod:`.common`). ``tools/*.py`` are their entry points.

* :mod:`.convert`: ``tools/model_converters/{pvt,swin,cadeit,veca}_to_mmcirc.py``;
* :mod:`.bccb_score`, :mod:`.vis_circulant`, :mod:`.vis_cores`: the attention tools in
  ``tools/analysis/`` (what they share: :mod:`.attention_tools`);
* :mod:`.pytorch2onnx`: ``tools/deployment/pytorch2onnx.py``;
* :mod:`.infer_highres`: ``tools/infer_highres.py`` (``--shard`` / ``--nproc``:
  :mod:`.infer_highres_sharded`);
* ``benchmark_<suite>``: ``tools/analysis/benchmark_*.py``, ``tools/deployment/benchmark_gpu.py``
  (:mod:`.benchmark`: ``python -m mmcirc.benchmark SUITE``); :mod:`.benchmark_docs`:
  ``python -m mmcirc.benchmark docs`` (``tools/analysis/benchmark_docs.py``), the docs'
  benchmark tables;
* :mod:`.runner`: what ``tools/train.py`` and ``tools/test.py`` share; :mod:`.override_flags`:
  the backbone override flags of ``tools/test.py``, ``get_flops.py`` and ``infer_highres.py``
  (and the library's messages about them in flag words).

The library below raises ``ValueError`` / ``TypeError`` or its own exception types and
holds no argument parser; importing this package imports none of the commands.
"""
