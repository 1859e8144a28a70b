"""colocate: GPU-sharing co-location runtime for deep-learning clusters.

Its subpackages are layered, bottom to top: ``base`` (vocabulary, units, the ``COLOCATE_*`` table,
endpoints, keys, the daemons' shared edge), ``protocol`` and ``gpus``; ``launcher``, ``clients``; ``node``
(the node coordinator); the engine integrations ``ray``, ``slurm``, ``_inject``; ``demo`` and ``cli``.
pyproject.toml's ``colocate-layers`` contract keeps that order. colocate never imports torch: the daemons
run without it.
"""

__version__ = "0.1.0"
