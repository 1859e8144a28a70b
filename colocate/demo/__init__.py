"""``colocate demo``: real daemons and real example jobs on simulated GPUs, and a report.

``node``: one simulated GPU, one pair of example jobs under each node policy side by side;
``evaluate``: the figures computed from a node's record.
"""
