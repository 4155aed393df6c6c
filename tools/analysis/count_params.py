"""Parameters of each named CA/Core pyramid as an ImageNet classifier.

Builds every variant through mmpretrain's MODELS as
``ImageClassifier(backbone, GlobalAveragePooling, LinearClsHead(1000))`` with
``out_indices=(3,)`` (224x224 input; parameter counts do not depend on the input
size, only PVT's position embeddings are stored for 224) and prints a markdown table.
``--baselines`` adds the same pyramids with their original attention everywhere
(``stage_attentions='sra'`` / ``'window'``: PVT v1 / Swin without circulant stages).

    python tools/analysis/count_params.py [--baselines]
"""
import argparse

import mmcirc  # noqa: F401  (registers the backbones)

VARIANTS = [('CAPVT', a) for a in ('tiny', 'small', 'medium', 'large')]
VARIANTS += [('CorePVT', a) for a in ('tiny', 'small', 'medium', 'large')]
VARIANTS += [('CASwin', a) for a in ('tiny', 'small', 'base')]
VARIANTS += [('CoreSwin', a) for a in ('tiny', 'small', 'base')]
ORIGINAL = {'CAPVT': 'sra', 'CASwin': 'window'}


def count(backbone_cfg, num_classes=1000):
    """(backbone params, total params, stage attentions) of the classifier."""
    from mmpretrain.registry import MODELS
    cfg = dict(type='ImageClassifier', backbone=dict(backbone_cfg, out_indices=(3, )),
               neck=dict(type='GlobalAveragePooling'),
               head=dict(type='LinearClsHead', num_classes=num_classes, in_channels=0))
    backbone = MODELS.build(cfg['backbone'])
    cfg['head']['in_channels'] = backbone.embed_dims[-1]
    model = MODELS.build(cfg)
    total = sum(p.numel() for p in model.parameters())
    n_backbone = sum(p.numel() for p in model.backbone.parameters())
    return n_backbone, total, model.backbone.stage_attentions


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--baselines', action='store_true', help='also the all-original pyramids')
    args = parser.parse_args()
    rows = [(name, arch, dict(type=name, arch=arch)) for name, arch in VARIANTS]
    if args.baselines:
        rows += [(f'{name} (all {att})', arch, dict(type=name, arch=arch, stage_attentions=att))
                 for name, att in ORIGINAL.items()
                 for arch in (('tiny', 'small', 'medium', 'large') if name == 'CAPVT' else ('tiny', 'small', 'base'))]
    print('| model | arch | stage attentions | backbone params (M) | classifier params (M) |')
    print('|---|---|---|---:|---:|')
    for name, arch, cfg in rows:
        n_backbone, total, attentions = count(cfg)
        print(f"| {name} | {arch} | {'-'.join(attentions)} | {n_backbone / 1e6:.2f} | {total / 1e6:.2f} |")


if __name__ == '__main__':
    main()
