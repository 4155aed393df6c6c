"""``tools/train.py --shard``'s config (mmcirc.cli.train.shard,
mmcirc.distributed.segmentor.train.shard_config): the wrapper, the data-parallel rank's
sampler and data workers set; a config whose ranks would not draw the same samples, or a
launch without a process group, refused in one line before anything is built."""

import argparse

import pytest
from mmengine.config import Config

from mmcirc.cli.common import CLIError
from mmcirc.cli.train import shard, sharded_config


def _cfg(**randomness):
    return Config(
        dict(
            launcher='pytorch',
            randomness=dict(seed=0, **randomness),
            train_dataloader=dict(
                batch_size=2, num_workers=3, sampler=dict(type='InfiniteSampler', shuffle=True)
            ),
        )
    )


ARGS = argparse.Namespace(auto_scale_lr=False)


def test_shard_sets_wrapper_sampler_and_workers():
    cfg = _cfg()
    shard(cfg, ARGS)
    assert sharded_config(cfg) and cfg.model_wrapper_cfg.type == 'SpatialParallel'
    assert cfg.train_dataloader.sampler == dict(
        type='DataRankSampler', sampler=dict(type='InfiniteSampler', shuffle=True)
    )
    assert cfg.train_dataloader.worker_init_fn == dict(
        type='data_rank_worker_init', num_workers=3, seed=0
    )
    shard(cfg, ARGS)  # idempotent
    assert cfg.train_dataloader.sampler.sampler.type == 'InfiniteSampler'


def test_sampler_draws_what_one_process_draws():
    from mmengine.dataset import DefaultSampler
    from mmengine.registry import DATA_SAMPLERS

    import mmcirc.distributed.segmentor.train  # noqa: F401  (registers the sampler)

    inner = dict(type='DefaultSampler', shuffle=True)
    ours = DATA_SAMPLERS.build(
        dict(type='DataRankSampler', sampler=inner),
        default_args=dict(dataset=list(range(10)), seed=3),
    )
    assert list(ours) == list(DefaultSampler(list(range(10)), shuffle=True, seed=3))


@pytest.mark.parametrize(
    'randomness, match',
    [
        (dict(seed=None), r'^randomness\.seed must be set for sharded training'),
        (dict(diff_rank_seed=True), r'^randomness\.diff_rank_seed must be False'),
    ],
)
def test_configs_whose_ranks_draw_differently_are_refused(randomness, match):
    cfg = _cfg()
    cfg.randomness.update(randomness)
    with pytest.raises(ValueError, match=match):
        shard(cfg, ARGS)
    assert 'model_wrapper_cfg' not in cfg


def test_without_a_launcher_or_with_auto_scale_lr_is_a_cli_error():
    cfg = _cfg()
    cfg.launcher = 'none'
    with pytest.raises(CLIError, match=r'^--shard needs a distributed launch: torchrun'):
        shard(cfg, ARGS)
    with pytest.raises(CLIError, match=r'^--shard and --auto-scale-lr'):
        shard(_cfg(), argparse.Namespace(auto_scale_lr=True))
