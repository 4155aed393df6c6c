"""Parameters of each named CA/Core pyramid as an ImageNet classifier.

Builds every variant through mmpretrain's MODELS as
``ImageClassifier(backbone, GlobalAveragePooling, LinearClsHead(1000))`` with
``out_indices=(3,)`` (224x224 input; parameter counts do not depend on the input
size, only PVT's position embeddings are stored for 224) and prints a markdown table.
``--baselines`` adds the same pyramids with their original attention everywhere
(``stage_attentions='sra'`` / ``'window'``: PVT v1 / Swin without circulant stages);
``tools/analysis/count_params.py``.
"""

import argparse

import mmcirc  # noqa: F401  (registers the backbones)
from mmcirc.analysis import count_params
from mmcirc.cli.common import main_guard


def variants():
    """(class name, arch) of every registered pyramid and named arch, and (family base
    class, its original attention kind) per family: read from the family table."""
    from mmcirc.models.families import pyramid_families

    families = pyramid_families()
    rows = [
        (cls.__name__, arch)
        for classes in families.values()
        for cls in classes
        for arch in cls.arch_zoo
    ]
    originals = [(classes[0], classes[0].original_attention) for classes in families.values()]
    return rows, originals


def count(backbone_cfg, num_classes=1000):
    """(backbone params, total params, stage attentions) of the classifier."""
    from mmpretrain.registry import MODELS

    cfg = dict(
        type='ImageClassifier',
        backbone=dict(backbone_cfg, out_indices=(3,)),
        neck=dict(type='GlobalAveragePooling'),
        head=dict(type='LinearClsHead', num_classes=num_classes, in_channels=0),
    )
    backbone = MODELS.build(cfg['backbone'])
    cfg['head']['in_channels'] = backbone.embed_dims[-1]
    model = MODELS.build(cfg)
    return count_params(model.backbone), count_params(model), model.backbone.stage_attentions


@main_guard
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--baselines', action='store_true', help='also the all-original pyramids')
    args = parser.parse_args(argv)
    named, originals = variants()
    rows = [(name, arch, dict(type=name, arch=arch)) for name, arch in named]
    if args.baselines:
        rows += [
            (
                f'{cls.__name__} (all {att})',
                arch,
                dict(type=cls.__name__, arch=arch, stage_attentions=att),
            )
            for cls, att in originals
            for arch in cls.arch_zoo
        ]
    print('| model | arch | stage attentions | backbone params (M) | classifier params (M) |')
    print('|---|---|---|---:|---:|')
    for name, arch, cfg in rows:
        n_backbone, total, attentions = count(cfg)
        print(
            f'| {name} | {arch} | {"-".join(attentions)} | {n_backbone / 1e6:.2f} | {total / 1e6:.2f} |'
        )
