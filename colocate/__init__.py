"""colocate: GPU-sharing co-location runtime for deep-learning clusters.

This package is the base every part shares (units, the ``COLOCATE_*`` environment
table, the device interface, the CLI) plus the node side (launcher, node
coordinator). It never imports torch at module level: the daemons run without it.
"""

__version__ = "0.1.0"
