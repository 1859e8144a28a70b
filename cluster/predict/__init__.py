"""Run-time prediction, pure (no clock, files or randomness).

``fingerprint``: a job's exact and family fingerprints from its user, its entry script's content
hash and its arguments. ``history``: the record kept per finished job and the key levels it is
looked up by. ``estimate``: weighted Kaplan-Meier quantiles of run times (finished jobs exact,
running ones censored). ``predictor``: ``RunTimePredictor``, the p50/p90 before start and the
remaining time after start, which the ``predictor`` plugin wraps for backfill and reports.
``crosshw``: what a job's layers and the hardware's features say about its time per iteration on
another GPU type (fitted on Justus et al. 2018's per-layer data)."""
