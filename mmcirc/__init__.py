"""mmcirc: circulant- and core-attention backbones for OpenMMLab."""
__version__ = '0.1.0'
