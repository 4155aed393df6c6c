"""Convert a Swin checkpoint to CA-Swin / Core-Swin (mmcirc.models.backbones.swin_convert).

Reads the official release (github.com/microsoft/Swin-Transformer: ``patch_embed.proj``,
``layers.{i}.blocks.{j}.attn.*``, ``layers.{i}.downsample``, ``norm``, ``head``,
converted with mmdet's ``swin_converter``) or an mmdet / mmseg / mmpretrain Swin
checkpoint (same keys as mmcirc), detected automatically. Loads the patch embedding,
patch merging, norms, every stage's MLP and the window attention of the stages that
keep it; reports the circulant / core attention (and CPE) left new and what of the
source went unused (stage 1-2 window attention, head, attention masks); writes
``{'state_dict', 'meta'}`` atomically.

    python tools/model_converters/swin_to_mmcirc.py swin_tiny_patch4_window7_224.pth
        # -> work_dirs/pretrained/ca_swin_t_in1k.pth
    python tools/model_converters/swin_to_mmcirc.py swin_small.pth --arch small --attention core
"""

import sys

from mmcirc.cli.convert import swin_main as main

if __name__ == '__main__':
    sys.exit(main())
