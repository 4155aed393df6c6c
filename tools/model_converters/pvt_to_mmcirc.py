"""Convert a PVT v1 checkpoint to CA-PVT / Core-PVT (mmcirc.models.backbones.pvt_convert).

Reads the official release (github.com/whai362/PVT: ``patch_embed1.proj``,
``pos_embed1``, ``block1.0.attn.q/kv/sr``, ``norm``, ``head``) or an mmdet
``PyramidVisionTransformer`` checkpoint (e.g. a whole detector, ``backbone.`` keys),
detected automatically. Loads patch/position embeddings, norms, every stage's MLP and
the spatial-reduction attention of the stages that keep it; reports the circulant /
core attention left new and what of the source went unused; writes
``{'state_dict', 'meta'}`` atomically.

    python tools/model_converters/pvt_to_mmcirc.py pvt_small.pth --arch small
        # -> work_dirs/pretrained/ca_pvt_s_in1k.pth
    python tools/model_converters/pvt_to_mmcirc.py pvt_tiny.pth out.pth --attention core
    python tools/model_converters/pvt_to_mmcirc.py pvt_small.pth --arch small \\
        --stage-attentions circulant circulant circulant sra --pos-embed-size 512
"""

import sys

from mmcirc.cli.convert import pvt_main as main

if __name__ == '__main__':
    sys.exit(main())
