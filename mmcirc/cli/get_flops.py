"""Parameters and FLOPs (multiply-adds) of a config's model, per backbone stage, with the
share of attention.

``tools/analysis/get_flops.py``: mmengine's FlopAnalyzer plus mmcirc's FFT / softmax / SDPA
handles (docs/analysis.md). The flags mean what they mean to mmdet's ``get_flops.py``.
"""

import argparse
import copy
import itertools
import json
import os.path as osp
import sys
from functools import partial

from mmcirc.analysis import attention_modules, count_params, flop_counter
from mmcirc.apis.builder import build_model, load_model_config
from mmcirc.benchmark.report import markdown_table
from mmcirc.cli.common import (
    CLIError,
    Once,
    add_cfg_options,
    add_override_args,
    check_device,
    main_guard,
    overrides_from_args,
)
from mmcirc.utils.fileio import atomic_open

DEFAULT_SHAPES = {'mmdet': (800, 1333), 'mmseg': (512, 512), 'mmpretrain': (224, 224)}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Params and FLOPs (MACs) of a model')
    parser.add_argument('config', help='config file (mmdet, mmseg or mmpretrain)')
    parser.add_argument(
        '--shape',
        type=int,
        nargs='+',
        action=Once,
        help='input H [W] (default: 800 1333 det, 512 512 seg, 224 224 cls)',
    )
    parser.add_argument(
        '--num-images',
        type=int,
        default=None,
        metavar='N',
        help="as mmdet's get_flops.py: the mean over the first N images of the config's "
        'val_dataloader, each at its own size (instead of one input of --shape)',
    )
    parser.add_argument(
        '--mode',
        choices=['auto', 'full', 'backbone'],
        default='auto',
        help="'full': tensor-mode forward; 'backbone': extract_feat "
        "(backbone + neck); 'auto': full, else backbone",
    )
    add_override_args(parser)
    parser.add_argument('--device', default='cpu', help='cpu or cuda')
    parser.add_argument('--out-json', default=None, help='also write the results here')
    add_cfg_options(parser)
    args = parser.parse_args(argv)
    if args.shape is not None and len(args.shape) not in (1, 2):
        raise CLIError(f'--shape takes H or H W, got {len(args.shape)} numbers')
    if args.num_images is not None and args.num_images < 1:
        raise CLIError(f'--num-images must be a positive number of images, got {args.num_images}')
    if args.num_images is not None and args.shape is not None:
        raise CLIError('--shape and --num-images exclude each other: one input size, or the images')
    check_device(args.device)
    args.overrides = overrides_from_args(args)  # ValueError: main_guard's error line
    return args


# ----------------------------------------------------------------------------- building
def padded_shape(cfg, shape):
    """(H, W) rounded up to the data preprocessor's pad / size divisor."""
    h, w = shape
    pre = cfg.model.get('data_preprocessor') or cfg.get('data_preprocessor') or {}
    div = pre.get('pad_size_divisor') or pre.get('size_divisor') or 1
    return -(-h // div) * div, -(-w // div) * div


def forward_fn(model, scope, mode, shape, data_samples=None):
    """The function to count: full tensor-mode forward or backbone + neck;
    ``data_samples``: a detector's, from the data preprocessor (else made for ``shape``)."""
    if not hasattr(model, 'extract_feat'):  # a bare backbone (model=dict(type=...))
        return model.forward
    if mode == 'backbone':
        return model.extract_feat
    if scope == 'mmdet':
        if data_samples is None:
            from mmdet.structures import DetDataSample

            hw = tuple(shape)
            meta = dict(img_shape=hw, ori_shape=hw, pad_shape=hw, batch_input_shape=hw)
            data_samples = [DetDataSample(metainfo=dict(img_id=0, scale_factor=(1.0, 1.0), **meta))]
        return partial(model.forward, data_samples=data_samples, mode='tensor')
    return partial(model.forward, mode='tensor')  # mmseg, mmpretrain


# ----------------------------------------------------------------------------- reporting
def stage_list(backbone):
    """(attribute, ModuleList) of the backbone's stages: an mmcirc pyramid's public
    ``stages`` (held under ``stages_attr``); for other backbones ``layers`` (mmdet
    PVT) or ``stages`` (Swin); else None."""
    import torch.nn as nn

    attr = getattr(backbone, 'stages_attr', None)
    if isinstance(attr, str) and isinstance(getattr(backbone, 'stages', None), nn.ModuleList):
        return attr, backbone.stages
    for attr in ('layers', 'stages'):
        stages = getattr(backbone, attr, None)
        if isinstance(stages, nn.ModuleList) and len(stages) > 1:
            return attr, stages
    return None, None


def attention_kind(stage):
    kind = getattr(stage, 'attention', None)
    if isinstance(kind, str):
        return kind
    names = attention_modules(stage)
    return type(stage.get_submodule(names[0])).__name__ if names else '-'


def report(model, fc):
    """Rows (dicts) per backbone stage and top-level part, and the summary."""
    by_module = fc.by_module()

    def row(part, name, module, attention='-'):
        return dict(
            part=part,
            module=name,
            attention=attention,
            flops=by_module.get(name, 0),
            attn_flops=sum(by_module.get(f'{name}.{a}', 0) for a in attention_modules(module)),
            params=count_params(module),
        )

    rows = []
    has_backbone = hasattr(model, 'backbone')
    backbone = model.backbone if has_backbone else model
    prefix = 'backbone.' if has_backbone else ''
    attr, stages = stage_list(backbone)
    if stages is not None:
        rows = [
            row(f'stage {i + 1}', f'{prefix}{attr}.{i}', stage, attention_kind(stage))
            for i, stage in enumerate(stages)
        ]
        bb_total = by_module.get(prefix.rstrip('.'), fc.total())
        rows.append(
            dict(
                part='backbone other',
                module=prefix + '*',
                attention='-',
                flops=bb_total - sum(r['flops'] for r in rows),
                attn_flops=0,
                params=count_params(backbone) - sum(r['params'] for r in rows),
            )
        )
    elif has_backbone:
        rows.append(row('backbone', 'backbone', backbone))
    if has_backbone:
        rows += [
            row(name, name, child)
            for name, child in model.named_children()
            if name not in ('backbone', 'data_preprocessor')
        ]
    summary = dict(
        flops=fc.total(),
        params=count_params(model),
        attn_flops=sum(by_module.get(a, 0) for a in attention_modules(model)),
        by_operator=dict(fc.by_operator()),
        unsupported_ops=dict(fc.unsupported_ops()),
    )
    return rows, summary


def unsigned_zero(value: float, digits: int) -> float:
    """``value`` rounded to ``digits`` decimals, a negative zero made 0.0: the backbone's
    remainder after its stages is a difference of float sums (FFT counts are not whole),
    which may leave -1e-9 where nothing is left."""
    return round(value, digits) + 0.0


def fmt_flops(x):
    """``x`` multiply-adds in G (from 10 M) or M, three decimals."""
    return f'{x / 1e9:.3f} G' if x >= 1e7 else f'{unsigned_zero(x / 1e6, 3):.3f} M'


def print_table(rows, summary, title):
    def cells(r):
        share = (
            f'{unsigned_zero(100 * r["attn_flops"] / r["flops"], 1):.1f} %' if r['flops'] else '-'
        )
        flops = (fmt_flops(r['flops']), fmt_flops(r['attn_flops']))
        return [r['part'], r['attention'], *flops, share, f'{r["params"] / 1e6:.2f} M']

    head = ['part', 'attention', 'FLOPs', 'attn FLOPs', 'attn share', 'params']
    table = [cells(r) for r in rows + [dict(summary, part='**total**', attention='')]]
    print(f'\n{title}\n\n' + markdown_table(head, table, 'llrrrr'))
    ops = sorted(summary['by_operator'].items(), key=lambda kv: -kv[1])
    shares = [f'{k} {fmt_flops(v)} ({100 * v / max(summary["flops"], 1):.1f} %)' for k, v in ops]
    print('\nby operator: ' + ', '.join(shares))
    if summary['unsupported_ops']:
        calls = ', '.join(f'{k} x{v}' for k, v in sorted(summary['unsupported_ops'].items()))
        print(f'not counted (no handle): {calls}')


def dataset_inputs(cfg, model, num_images, device):
    """(inputs, data_samples) of the first ``num_images`` images of the config's
    ``val_dataloader``, one image a batch, through the model's data preprocessor (as
    mmdet's ``get_flops.py`` feeds its counter)."""
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner

    if not cfg.get('val_dataloader'):
        raise CLIError('--num-images: the config has no val_dataloader to take images from')
    init_default_scope(cfg.default_scope)
    loader_cfg = copy.deepcopy(cfg.val_dataloader)
    loader_cfg.update(batch_size=1, num_workers=0, persistent_workers=False)
    for batch in itertools.islice(Runner.build_dataloader(loader_cfg), num_images):
        data = model.data_preprocessor(batch, False)
        yield data['inputs'].to(device), data.get('data_samples')


def count_one(model, scope, modes, inputs, data_samples=None):
    """(FlopCounter, the mode counted) of one input: the first of ``modes`` that traces."""
    err = None
    for mode in modes:
        try:
            fn = forward_fn(model, scope, mode, tuple(inputs.shape[-2:]), data_samples)
            return flop_counter(model, inputs, forward=fn), mode
        except Exception as e:  # noqa: BLE001 (report and fall back)
            err = e
            print(
                f'note: counting the {mode} forward failed ({type(e).__name__}: '
                f'{str(e).splitlines()[0][:200] if str(e) else ""})',
                file=sys.stderr,
            )
    raise CLIError(f'could not trace the model: {err}')


def mean_report(reports):
    """The mean of several (rows, summary) of one model (their counts averaged)."""
    rows = [dict(r) for r in reports[0][0]]
    for i, row in enumerate(rows):
        for key in ('flops', 'attn_flops'):
            row[key] = sum(rs[i][key] for rs, _ in reports) / len(reports)
    summary = dict(reports[0][1])
    for key in ('flops', 'attn_flops'):
        summary[key] = sum(s[key] for _, s in reports) / len(reports)
    ops = {op for _, s in reports for op in s['by_operator']}
    summary['by_operator'] = {
        op: sum(s['by_operator'].get(op, 0) for _, s in reports) / len(reports) for op in ops
    }
    summary['unsupported_ops'] = {
        op: max(s['unsupported_ops'].get(op, 0) for _, s in reports)
        for op in {op for _, s in reports for op in s['unsupported_ops']}
    }
    return rows, summary


@main_guard
def main(argv=None):
    import torch

    args = parse_args(argv)
    cfg = load_model_config(args.config, args.cfg_options)
    scope = cfg.default_scope
    device = torch.device(args.device)
    # weights not initialised: FLOPs do not depend on them
    model = build_model(cfg, overrides=args.overrides, init_weights=False).to(device)
    modes = ['full', 'backbone'] if args.mode == 'auto' else [args.mode]
    if args.num_images:
        reports, shapes, used = [], [], None
        for inputs, samples in dataset_inputs(cfg, model, args.num_images, device):
            # once the full forward failed, the other images go to the fallback directly
            left = modes[modes.index(used) :] if used else modes
            fc, used = count_one(model, scope, left, inputs, samples)
            reports.append(report(model, fc))
            shapes.append(tuple(inputs.shape[-2:]))
        if not reports:
            raise CLIError('--num-images: the val_dataloader gave no image')
        rows, summary = mean_report(reports)
        sizes = sorted(set(shapes))
        listed = ', '.join(f'1x3x{h}x{w}' for h, w in sizes)
        where = f'mean over {len(shapes)} images of val_dataloader, inputs {listed}'
        shape = list(shapes[0]) if len(sizes) == 1 else [list(s) for s in shapes]
    else:
        shape = tuple(args.shape) if args.shape else DEFAULT_SHAPES[scope]
        shape = padded_shape(cfg, (shape[0], shape[-1]))
        fc, used = count_one(model, scope, modes, torch.randn(1, 3, *shape, device=device))
        rows, summary = report(model, fc)
        where = f'input 1x3x{shape[0]}x{shape[1]}'
    what = 'tensor-mode forward' if used == 'full' else 'backbone + neck (extract_feat)'
    title = f'{osp.basename(args.config)}: {where}, {what}; FLOPs = multiply-adds'
    print_table(rows, summary, title)
    if args.out_json:
        record = dict(config=args.config, shape=shape, mode=used, rows=rows, **summary)
        if args.num_images:
            record['num_images'] = len(shapes)
        with atomic_open(args.out_json, 'w') as f:
            json.dump(record, f, indent=1, default=float)
    return rows, summary
