"""The README's first sections hold what a new user looks for: the mission's three
commands right after the introduction, runnable as written (every checkpoint a command
loads is downloaded, converted or trained by an earlier line of the block; one process
running an 8-GPU recipe scales its learning rate), the two set-up commands, and the list
of what is not validated."""

import os.path as osp
import re
import shlex

from mmengine.config import Config

from helpers import REPO

MISSION = 'Train on COCO, test on ADE20K, infer at high resolution'


def _readme():
    with open(osp.join(REPO, 'README.md')) as f:
        return f.read()


def _section(title):
    text = _readme()
    start = text.index(f'\n## {title}\n')
    end = text.find('\n## ', start + 1)
    return text[start:end]


def _code_lines(section):
    blocks = re.findall(r'```bash\n(.*?)```', section, flags=re.S)
    return [ln.split('#')[0].strip() for b in blocks for ln in b.splitlines() if ln.strip()]


def _commands(tool):
    """The argv of every ``python tools/<tool>`` line of the mission's block."""
    lines = _code_lines(_section(MISSION))
    return [shlex.split(ln)[2:] for ln in lines if ln.startswith(f'python tools/{tool} ')]


def _cfg_option(argv, key):
    if '--cfg-options' not in argv:
        return None
    for item in argv[argv.index('--cfg-options') + 1 :]:
        if item.startswith(f'{key}='):
            return item.split('=', 1)[1]
    return None


def _config(path):
    return Config.fromfile(osp.join(REPO, path))


def test_install_holds_the_two_set_up_commands():
    assert _code_lines(_section('Install')) == ['bash tools/run_demo.sh', 'bash tools/run_tests.sh']


def test_the_three_commands_follow_the_introduction():
    text = _readme()
    first_section = text.index('\n## ')
    assert text.index(f'\n## {MISSION}\n') == first_section
    configs = [argv[0] for argv in _commands('train.py')]
    assert 'configs/ca_pvt_s_retinanet_coco.py' in configs
    assert any(argv[0].endswith('ade20k.py') for argv in _commands('test.py'))
    assert _commands('infer_highres.py')


def test_every_checkpoint_a_training_loads_is_made_by_the_block():
    """The ImageNet checkpoint each config starts from (its own, or the one its
    ``--cfg-options`` names) is a converter's output in the block (its OUT argument, or
    the ``# -> PATH`` its line names), converted from a file the block downloads."""
    blocks = re.findall(r'```bash\n(.*?)```', _section(MISSION), flags=re.S)
    raw = [ln for b in blocks for ln in b.splitlines()]
    downloaded = {osp.basename(u) for ln in raw if ln.startswith('wget ') for u in ln.split()[1:]}
    made = {}
    for ln in raw:
        if ln.startswith('python tools/model_converters/'):
            code, _, comment = ln.partition('#')
            src, *rest = shlex.split(code)[2:]
            out = rest[0] if rest and not rest[0].startswith('-') else comment.split('->')[1]
            made[out.strip()] = src
    for argv in _commands('train.py'):
        key = 'model.backbone.init_cfg.checkpoint'
        loaded = _cfg_option(argv, key) or _config(argv[0]).model.backbone.init_cfg.checkpoint
        assert loaded in made, (argv[0], loaded, made)
        assert made[loaded] in downloaded, (loaded, made[loaded], downloaded)


def test_every_checkpoint_tested_or_inferred_is_written_by_a_training_of_the_block():
    trained = {}
    for argv in _commands('train.py'):
        loop = _config(argv[0]).train_cfg
        last = f'iter_{loop.max_iters}' if 'max_iters' in loop else f'epoch_{loop.max_epochs}'
        trained[argv[0]] = f'work_dirs/{osp.splitext(osp.basename(argv[0]))[0]}/{last}.pth'
    for argv in _commands('test.py') + _commands('infer_highres.py'):
        assert trained.get(argv[0]) == argv[1], (argv[:2], trained)


def test_one_process_running_an_8_gpu_recipe_scales_its_learning_rate():
    for argv in _commands('train.py'):
        cfg = _config(argv[0])
        if cfg.auto_scale_lr.base_batch_size > cfg.train_dataloader.batch_size:
            assert '--auto-scale-lr' in argv, argv[0]


def test_the_pvt_downloads_are_the_files_mmdets_pvt_configs_load():
    lines = _code_lines(_section(MISSION))
    urls = [url for ln in lines if ln.startswith('wget ') for url in ln.split()[1:]]
    import mmdet

    pvt = osp.join(osp.dirname(mmdet.__file__), '.mim', 'configs', 'pvt')
    mmdet = {
        Config.fromfile(osp.join(pvt, f'retinanet_pvt-{s}_fpn_1x_coco.py')).model.backbone.init_cfg[
            'checkpoint'
        ]
        for s in ('t', 's')
    }
    assert urls and set(urls) <= mmdet, (urls, mmdet)


def test_the_readme_lists_what_is_not_validated():
    section = _section('What is validated, and what is not')
    not_validated = section[section.index('Not validated:') :]
    for item in ('No trained accuracy', 'gloo', 'NCCL'):
        assert item in not_validated, item
