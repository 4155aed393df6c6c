"""The documentation's generators are repository upkeep in .dev_scripts/ (not in the
package): their tests import them from there."""

import os.path as osp
import sys

from helpers import REPO

sys.path.insert(0, osp.join(REPO, '.dev_scripts'))
