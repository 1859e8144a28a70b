"""Ray on loopback only: read by ``ray`` when it is imported, so set before any test module here imports it
(Ray otherwise turns 127.0.0.1 into the host's own address, and reports usage)."""

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
