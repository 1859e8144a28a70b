"""colocate inside Slurm: the SPANK plugin's C source (``spank_colocate.c``), the TaskProlog
(``task_prolog.sh``) and the per-task resolver (``worker.resolve``). ``site`` builds the site's
configuration lines and checks them (``colocate slurm config``). See ``docs/slurm.md``."""
