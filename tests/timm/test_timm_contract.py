"""timm's own model tests on mmcirc's models: ``tests/test_models.py`` of the installed
timm (fetched by tools/setup_env.sh) with the models placed in timm's lists
(:mod:`timm_suite`). The TorchScript tests are deselected (tests/timm/conftest.py)."""

from timm_suite import collect

globals().update(collect())
