"""The scripts' modules import as the scripts run them: scripts/lib's by their own names, and
scripts/cluster_bench as a package beside scripts/bench_cluster.py."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.join(HERE, "..", "lib"), os.path.join(HERE, "..")):
    sys.path.insert(0, os.path.abspath(path))
