"""Tests of the trace-driven simulator (cluster/sim)."""
