"""timm's own pieces as clients of the registered models: validate.py's evaluation loop
(create_dataset / resolve_data_config / create_loader), train.py's optimizer and
scheduler factories with gradient checkpointing, and torch.compile and torch.export of
a whole model."""

import numpy as np
import pytest
import torch
from PIL import Image


def _toy_imagenet(root):
    """mmcirc's toy ImageNet (``{train,val}/<class>/*.jpg``, 3 classes; 64 x 80 images)."""
    from mmcirc.datasets.toy_data import make_toy_imagenet

    return make_toy_imagenet(root, num_train=6, num_val=6, img_size=(64, 80))['root']


def test_validate_loop_preprocesses_as_the_mmpretrain_test_pipeline(tmp_path, small):
    """validate.py's loop on the toy ImageNet folder: the data config comes from the
    model's pretrained_cfg; its transform is the configs' test pipeline (short edge to
    crop / 0.875, bicubic, centre crop, ImageNet mean / std), written out here with
    torchvision."""
    from timm.data import create_dataset, create_loader, resolve_data_config
    from timm.utils import accuracy
    from torchvision import transforms as T

    root = _toy_imagenet(tmp_path)
    model = small('ca_deit_tiny', num_classes=3)
    config = resolve_data_config({'input_size': (3, 48, 48)}, model=model)
    assert config['interpolation'] == 'bicubic' and config['crop_pct'] == 0.875
    dataset = create_dataset('', root=str(root), split='validation')
    loader = create_loader(dataset, batch_size=4, use_prefetcher=False, num_workers=0, **config)
    logits, targets = [], []
    with torch.no_grad():
        for images, target in loader:
            logits.append(model(images))
            targets.append(target)
    logits, targets = torch.cat(logits), torch.cat(targets)
    (top1,) = accuracy(logits, targets, topk=(1,))
    assert logits.shape == (6, 3) and 0 <= float(top1) <= 100

    ref_tf = T.Compose(
        [
            T.Resize(int(48 / 0.875), interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(48),
            T.ToTensor(),
            T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    files = sorted((root / 'val').glob('*/*.jpg'))  # the folder order: class, then name
    batch = torch.stack([ref_tf(Image.open(f).convert('RGB')) for f in files])
    with torch.no_grad():
        ref = model(batch)
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    assert targets.tolist() == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize('name', ['ca_deit_tiny', 'core_pvt_tiny'])
def test_training_with_timm_optimizer_scheduler_and_grad_checkpointing(tmp_path, small, name):
    """train.py's pieces: a batch of the toy ImageNet train split through timm's
    training transforms, create_optimizer_v2 (AdamW, layer decay), create_scheduler_v2
    (cosine), gradient checkpointing on."""
    from timm.data import create_dataset, create_loader
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2

    dataset = create_dataset('', root=str(_toy_imagenet(tmp_path)), split='train', is_training=True)
    loader = create_loader(
        dataset, (3, 32, 32), batch_size=6, is_training=True, use_prefetcher=False, num_workers=0
    )
    torch.manual_seed(1)
    x, y = next(iter(loader))
    model = small(name, num_classes=3, drop_path_rate=0.0)
    model.set_grad_checkpointing(True)
    model.train()
    opt = create_optimizer_v2(model, 'adamw', lr=2e-3, weight_decay=0.05, layer_decay=0.9)
    sched, epochs = create_scheduler_v2(opt, sched='cosine', num_epochs=4, warmup_epochs=0)
    losses, lrs = [], []
    for epoch in range(epochs):
        for _ in range(2):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        lrs.append(opt.param_groups[-1]['lr'])
        sched.step(epoch + 1)
    assert epochs == 4 and all(np.isfinite(losses))
    assert losses[-1] < losses[0]  # it learns the batch
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] < lrs[0]  # the cosine schedule


@pytest.fixture
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize('name', ['ca_deit_tiny', 'veca_small', 'ca_pvt_tiny'])
def test_torch_compile_of_the_whole_model_is_one_graph_equal_to_eager(_fresh_dynamo, small, name):
    """One graph, no break (dynamo's explain), the compiled run (aot_eager: no C++ build
    on the CPU, as tests/deployment/test_compile.py) equal to eager."""
    model = small(name, num_classes=3)
    x = torch.randn(2, 3, 40, 56)
    with torch.no_grad():
        explain = torch._dynamo.explain(model)(x)
        assert explain.graph_break_count == 0, explain.break_reasons
        assert explain.graph_count == 1
        ref = model(x)
        out = torch.compile(model, backend='aot_eager', fullgraph=True)(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('name', ['ca_deit_tiny', 'veca_small', 'ca_swin_tiny'])
def test_torch_export_of_the_whole_model_equals_eager(_fresh_dynamo, small, name):
    """torch.export (the deployment path; TorchScript is not supported) of a timm-created
    model, run on another input of the exported size: equal to eager."""
    model = small(name, num_classes=3)
    x = torch.randn(2, 3, 40, 56)
    with torch.no_grad():
        exported = torch.export.export(model, (x,)).module()
        y = torch.randn(2, 3, 40, 56)
        torch.testing.assert_close(exported(y), model(y), rtol=1e-5, atol=1e-5)
