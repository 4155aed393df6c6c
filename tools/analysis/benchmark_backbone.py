"""Forward time and peak memory of mmcirc backbones against the mmdet / mmseg baselines,
side by side over input sizes (batch 1, no grad, eval mode).

    python tools/analysis/benchmark_backbone.py [--models a b ...] [--sizes 224 512 ...]
        [--device cpu|cuda] [--threads N] [--timeout S] [--repeats 10] [--min-repeats 1]
        [--budget 10] [--single-run-above 30] [--precisions fp32 [bf16 fp16]] [--batch 1]
        [--flops] [--fresh] [--out-dir DIR]

Models: pvt_s, circ_pvt_s, core_pvt_s, core_pvt_s_c8, ca_pvt_s, core_pvt_s_paper, swin_t,
swin_t_mmseg, ca_swin_t, core_swin_t, ca_pvt_t, core_pvt_t (mmcirc.benchmark.cases).
Writes DIR/results_<stem>.json (merged with earlier runs), DIR/table_<stem>.md and
DIR/{time,memory}_<stem>.png (stem: the device, _bf16 / _fp16, _b<N> where not fp32 /
batch 1). The entry point of the harness's ``backbone`` suite
(mmcirc/benchmark/suites/backbone.py, also ``python -m mmcirc.benchmark backbone``).
"""

from mmcirc.cli.benchmark_backbone import main

if __name__ == '__main__':
    main()
