"""colocate's base: what every part stands on (vocabulary, units, the COLOCATE_* variables, endpoints, keys, files, the shared daemon edge). It imports nothing of colocate above it."""
