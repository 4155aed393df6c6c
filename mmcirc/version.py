"""The version of mmcirc: the one string the package (``mmcirc.__version__``) and its
wheel (``pyproject.toml`` reads it) report."""

__version__ = '0.1.0'
