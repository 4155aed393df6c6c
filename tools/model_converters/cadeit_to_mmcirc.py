"""Initialise the circulant blocks of CA-Swin / CA-PVT from a CA-DeiT checkpoint
(github.com/LeapLabTHU/Circulant-Attention, ``models/ca_deit.py``; mmcirc.models.backbones.deit_convert).

CA-DeiT is isotropic (width 192 / 384 / 768 for T / S / B): its blocks (CPE, norms,
gate, bias-free qkv, proj, MLP) fit only circulant blocks of the same width, which
are filled in order from CA-DeiT block 0 (or ``--source-blocks``). With the paper's
layout only CA-Swin-T/S stage 2 (width 192) fits, from CA-DeiT-T; CA-DeiT-S (384) and
-B (768) fit Swin-T/S stages 3 / 4 once they are circulant; no PVT or Swin-B stage
has a DeiT width. ``--base`` starts from a checkpoint in mmcirc's layout (e.g. the
output of swin_to_mmcirc.py) so that the rest of the backbone is initialised too.

    python tools/model_converters/swin_to_mmcirc.py swin_tiny.pth base.pth
    python tools/model_converters/cadeit_to_mmcirc.py ca_deit_tiny.pth \\
        work_dirs/pretrained/ca_swin_t_in1k.pth --base base.pth
    python tools/model_converters/cadeit_to_mmcirc.py ca_deit_small.pth --arch tiny \\
        --stage-attentions circulant circulant circulant window
        # -> work_dirs/pretrained/swin_t_circulant-circulant-circulant-window_ca-deit-s.pth

``--family deit`` converts the released CA-DeiT file itself (``{'model': state_dict}``)
for mmcirc's :class:`CADeiT` plus mmpretrain's ``LinearClsHead`` (keys ``backbone.*``,
``head.fc.*``; arch read from the tensors, ``--arch`` only checks it); every tensor is
loaded, nothing is new or unused (mmcirc.models.backbones.deit_convert):

    python tools/model_converters/cadeit_to_mmcirc.py ca_deit_small.pth --family deit
        # -> work_dirs/pretrained/ca_deit_s_official.pth
"""

import sys

from mmcirc.cli.convert import cadeit_main as main

if __name__ == '__main__':
    sys.exit(main())
