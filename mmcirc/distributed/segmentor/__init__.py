"""mmseg segmentors spatially sharded (the OpenMMLab libraries needed): :mod:`.model`
(``shard_model``, ``check_shardable``, ``predict_sharded``: band-wise inference),
:mod:`.infer` (one image measured: ``tools/infer_highres.py --shard / --nproc``),
:mod:`.loss` (the heads' losses on bands), :mod:`.train` (``SpatialParallel``, the
mmengine model wrapper of ``tools/train.py --shard``)."""
