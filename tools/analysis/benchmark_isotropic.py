"""The released isotropic models against the plain-attention ViTs of the same size, side
by side in one run: CA-DeiT vs DeiT, VECA vs ViT (backbone forward; needs timm).

    python tools/analysis/benchmark_isotropic.py [--models ca_deit_s deit_s veca_b vit_b]
        [--sizes 224 512 1024 2048] [--repeat 5] [--single-run-above 20] [--depth N]
        [--threads N] [--no-flops | --flops-only] [--timeout 3600] [--device cpu|cuda]
        [--precision fp32|bf16|fp16] [--batch 1]
        [--fresh] [--out-dir DIR]

Models: ca_deit_{t,s,b}, veca_{s,b} (mmcirc) and deit_{t,s,b}, vit_{s,b} (timm), random
weights. Writes DIR/results.json (merged with earlier runs of the same depth, threads and
device) and DIR/table.md (default work_dirs/benchmark_isotropic). The entry point of the
harness's ``isotropic`` suite (mmcirc/benchmark/suites/isotropic.py, also ``python -m
mmcirc.benchmark isotropic``), where the method is described.
"""

from mmcirc.cli.benchmark_isotropic import main

if __name__ == '__main__':
    main()
