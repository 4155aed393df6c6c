"""Spatial parallelism for built mmseg segmentors: one whole image computed by P
processes, each holding one horizontal band of rows of every feature map, with the
models' own forwards run on row-banded maps (:class:`mmcirc.distributed.BandedMap`).

Modules (with the OpenMMLab libraries): :mod:`.model` (``shard_model``,
``check_shardable``, ``predict_sharded``: a built mmseg segmentor sharded),
:mod:`.infer` (one image measured,
the library of ``tools/infer_highres.py --shard / --nproc``) and :mod:`.train`
(``SpatialParallel``, the mmengine model wrapper of ``tools/train.py --shard``: one
process's training step computed band-wise). The torch-only machinery
(band rule, row exchange, distributed FFT, launcher) is :mod:`mmcirc.distributed`."""
