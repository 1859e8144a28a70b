"""Tests of the cluster scheduler package (cluster/)."""
