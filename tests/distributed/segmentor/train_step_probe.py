"""One sharded training step of a full-size segmentor against one process, in float64 and
in float32: random weights (seed 0), one random S x S image with 10 % ignored pixels, drop
path and dropout off (float32 and float64 draw different masks), mmengine's
``train_step`` with SGD. For each P: the logged values' relative difference and the
largest relative difference (to the largest entry of that gradient) of any parameter's
gradient, float64 sharded against float64 one process, and float32 (one process and
sharded) against float64 one process. Prints one line per comparison.
Not a test: the record behind docs/benchmarks.md (sharded training).

    PYTHONPATH=tests python tests/distributed/segmentor/train_step_probe.py --size 1024
"""

import argparse
import os.path as osp

import torch

from helpers import REPO, CastInputs, seg_batch, sgd_step_record
from mmcirc.distributed import run_parallel

CONFIGS = ('ca_pvt_t-allcirc_fpn_80k_ade20k.py', 'core_pvt_t-allcore_fpn_80k_ade20k.py')


def build(config, size, dtype):
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm

    from mmcirc.apis.builder import build_model

    cfg = Config.fromfile(osp.join(REPO, 'configs', config))
    cfg.model.data_preprocessor.size = (size, size)
    cfg.model.backbone.update(init_cfg=None, drop_path_rate=0.0)
    cfg.model.decode_head.dropout_ratio = 0.0
    model = revert_sync_batchnorm(build_model(cfg, seed=0)).to(dtype).train()
    model.data_preprocessor.forward = CastInputs(model.data_preprocessor, dtype)
    return model


def step(model, train_step, size):
    """(logged values, every parameter's gradient at the optimizer step) of one step on
    one S x S image (150 classes, 10 % of the pixels ignored)."""
    batch = seg_batch(1, (size, size), num_classes=150, ignored=0.1)
    return sgd_step_record(model, train_step, batch)[:2]


def sharded_step(config, size, dtype):
    from mmcirc.distributed.segmentor.train import SpatialParallel

    wrapped = SpatialParallel(build(config, size, dtype))
    return step(wrapped.module, wrapped.train_step, size)


def one_process(config, size, dtype):
    model = build(config, size, dtype)
    return step(model, model.train_step, size)


def compare(got, ref):
    """(largest relative difference of the logged values, of the gradients, and the
    parameter where the latter is)."""
    (log, grads), (ref_log, ref_grads) = got, ref
    assert grads.keys() == ref_grads.keys(), 'different parameters hold gradients'
    logged = max(abs(log[k] - v) / abs(v) for k, v in ref_log.items() if v)
    rel = {
        n: float((grads[n].double() - g).abs().max() / g.abs().max().clamp_min(1e-300))
        for n, g in ref_grads.items()
    }
    worst = max(rel, key=rel.get)
    return logged, rel[worst], worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--size', type=int, default=1024)
    parser.add_argument('--nprocs', type=int, nargs='+', default=[2, 3])
    parser.add_argument('--configs', nargs='+', default=list(CONFIGS))
    args = parser.parse_args()
    for config in args.configs:
        ref = one_process(config, args.size, torch.float64)
        runs = {('float32', 1): one_process(config, args.size, torch.float32)}
        for p in args.nprocs:
            for dtype in (torch.float64, torch.float32):
                ranks = run_parallel(
                    sharded_step,
                    p,
                    args=(config, args.size, dtype),
                    start_method='spawn',
                    timeout_s=3600,
                )
                runs[(str(dtype).split('.')[1], p)] = ranks[0]
        for (dtype, p), got in runs.items():
            logged, grad, where = compare(got, ref)
            print(
                f'{config} {args.size} px {dtype} P={p} vs float64 one process: logged values '
                f'{logged:.1e}, gradients {grad:.1e} ({where}, {len(ref[1])} parameters)',
                flush=True,
            )


if __name__ == '__main__':
    main()
