"""The README's first sections hold what a new user looks for: the two set-up commands,
the mission's three commands with the prerequisites their configs read, and the list of
what is not validated."""

import os.path as osp
import re

from mmengine.config import Config

from helpers import REPO


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


def test_install_holds_the_two_set_up_commands():
    assert _code_lines(_section('Install')) == ['bash tools/run_demo.sh', 'bash tools/run_tests.sh']


def test_the_three_commands_come_before_install():
    text = _readme()
    commands = _code_lines(_section('Train on COCO, test on ADE20K, infer at high resolution'))
    train = 'python tools/train.py configs/ca_pvt_s_retinanet_coco.py'
    assert train in commands
    assert any(c.startswith('python tools/test.py configs/') and 'ade20k' in c for c in commands)
    assert any(c.startswith('python tools/infer_highres.py configs/') for c in commands)
    assert text.index(train) < text.index('\n## Install\n')


def test_the_prerequisite_named_is_the_checkpoint_the_config_loads():
    section = _section('Train on COCO, test on ADE20K, infer at high resolution')
    for config in re.findall(r'python tools/(?:train|test)\.py (configs/\S+\.py)', section):
        checkpoint = Config.fromfile(osp.join(REPO, config)).model.backbone.init_cfg.checkpoint
        assert checkpoint in section, (config, checkpoint)


def test_the_readme_lists_what_is_not_validated():
    section = _section('What is validated, and what is not')
    not_validated = section[section.index('Not validated:') :]
    for item in ('No trained accuracy', 'gloo', 'NCCL'):
        assert item in not_validated, item
