"""Tests of the run-time predictors (cluster/predict/)."""
