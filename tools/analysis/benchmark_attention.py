"""Benchmark global softmax attention vs circulant and core attention: one layer (C = 64,
batch 1), time and peak memory against N = H*W, with the CPU acceptance targets.

    python tools/analysis/benchmark_attention.py [--sizes 32 64 128 256 512] [--repeat 5]
        [--device cpu|cuda] [--amp bf16|fp16] [--no-backward] [--threads N]
        [--methods sdpa circ-circ circ-zero circ-linears core-8 core-16 core-64]
        [--max-seconds 60] [--timeout S] [--fresh] [--out-dir work_dirs/benchmark_attention]

Writes DIR/results.json (merged with earlier runs of the same device, precision and
threads; ``--fresh``: not), DIR/table.md, DIR/benchmark.png and DIR/benchmark_memory.png.
The entry point of the harness's ``attention`` suite (mmcirc/benchmark/suites/attention.py,
also ``python -m mmcirc.benchmark attention``), where the method is described.
"""

from mmcirc.cli.benchmark_attention import main

if __name__ == '__main__':
    main()
