"""``tools/train.py --shard``'s config (mmcirc.cli.train.shard,
mmcirc.distributed.segmentor.train.shard_config): the wrapper, the data-parallel rank's
sampler and data workers set (``--shard-size``: the data x space mesh's data rank, against
mmengine's own sampler and worker seeding over the data groups); a config whose ranks
would not draw the same samples, a bad shard size, or a launch without a process group,
refused in one line before anything is built."""

import argparse
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from helpers import REPO

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


ARGS = argparse.Namespace(auto_scale_lr=False, shard_size=None)


def test_shard_sets_wrapper_sampler_and_workers():
    cfg = _cfg()
    shard(cfg, ARGS)
    assert sharded_config(cfg) and cfg.model_wrapper_cfg.type == 'SpatialParallel'
    assert cfg.train_dataloader.sampler == dict(
        type='DataRankSampler', sampler=dict(type='InfiniteSampler', shuffle=True), shard_size=None
    )
    assert cfg.train_dataloader.worker_init_fn == dict(
        type='data_rank_worker_init', num_workers=3, seed=0, shard_size=None
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
        shard(_cfg(), argparse.Namespace(auto_scale_lr=True, shard_size=None))


def test_shard_size_reaches_the_wrapper_the_sampler_and_the_workers():
    cfg = _cfg()
    shard(cfg, argparse.Namespace(auto_scale_lr=False, shard_size=2))
    loader = cfg.train_dataloader
    assert cfg.model_wrapper_cfg == dict(type='SpatialParallel', shard_size=2)
    assert loader.sampler.shard_size == 2 and loader.worker_init_fn.shard_size == 2
    again = _cfg()
    again.model_wrapper_cfg = dict(type='SpatialParallel', shard_size=4)
    shard(again, ARGS)  # the config's own, without the flag
    assert again.train_dataloader.sampler.shard_size == 4
    with pytest.raises(CLIError, match=r'^--shard-size must be a positive int, got 0$'):
        shard(_cfg(), argparse.Namespace(auto_scale_lr=False, shard_size=0))
    from mmcirc.distributed.segmentor.train import shard_config

    with pytest.raises(ValueError, match=r'^shard_size must be a positive int .*got 2\.5$'):
        shard_config(_cfg(), 2.5)


def _world(monkeypatch, rank, size):
    """This process as ``rank`` of a world of ``size`` (what the mesh's data rank reads)."""
    import mmcirc.distributed.comm as comm

    monkeypatch.setattr(comm, 'group_rank_size', lambda group=None: (rank, size))


@pytest.mark.parametrize('shard_size', [1, 2])
def test_each_data_group_draws_its_share_of_one_process_samples(monkeypatch, shard_size):
    """4 ranks, S ranks per group: rank r draws what data rank r // S of 4 / S draws in
    mmengine's own data-parallel sampling (every (4 / S)-th index of one process's
    order), the same on the ranks of a group; the groups together draw every index."""
    from mmengine.dataset import DefaultSampler
    from mmengine.registry import DATA_SAMPLERS

    import mmcirc.distributed.segmentor.train  # noqa: F401  (registers the sampler)

    data = list(range(12))
    order = list(DefaultSampler(data, shuffle=True, seed=3))  # one process
    groups = 4 // shard_size
    drawn = []
    for rank in range(4):
        _world(monkeypatch, rank, 4)
        cfg = dict(type='DataRankSampler', sampler=dict(type='DefaultSampler', shuffle=True),
                   shard_size=shard_size)  # fmt: skip
        drawn.append(list(DATA_SAMPLERS.build(cfg, default_args=dict(dataset=data, seed=3))))
        assert drawn[-1] == order[rank // shard_size :: groups]
    assert sorted(sum(drawn[::shard_size], [])) == data


def test_data_workers_are_seeded_as_the_data_rank(monkeypatch):
    """mmengine's worker seed is num_workers * rank + worker_id + seed: rank 3 of 4 with
    2 ranks per group seeds its worker 1 of 2 as data rank 1 does: 2 + 1 + 3."""
    from mmcirc.distributed.segmentor.train import data_rank_worker_init

    _world(monkeypatch, 3, 4)
    with torch.random.fork_rng():
        data_rank_worker_init(1, num_workers=2, seed=3, shard_size=2)
        assert torch.initial_seed() == 6


def test_shard_size_without_shard_is_one_error_line(capsys):
    from mmcirc.cli.train import main

    with pytest.raises(SystemExit) as exit_:
        main([osp.join(REPO, 'configs', 'toy', 'ca_pvt_t_fpn_toy_ade.py'), '--shard-size', '2'])
    assert exit_.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == 'error: --shard-size needs --shard'
