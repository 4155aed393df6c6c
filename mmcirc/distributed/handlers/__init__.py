"""Every handler of :class:`~mmcirc.distributed.banded_map.BandedMap` beyond the local band,
one module per op family: :mod:`.torch_functions` (convolutions, interpolation, pooling,
norms, token reshapes, ...), :mod:`.circulant` (``ShardedCirculantAttention`` and its
transform backend ``ShardedFFT``), :mod:`.core` (``ShardedCoreAttention``), :mod:`.veca`
(core-periphery attention). Importing a module registers its handlers."""
