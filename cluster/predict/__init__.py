"""Run-time prediction: what a job's features and the hardware's say about its time per iteration."""
