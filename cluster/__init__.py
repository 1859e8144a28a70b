"""The global scheduler and the trace-driven simulator (gang, bin-packing, FIFO,
multi-queue, backfill). Built in the next stage; see the issues."""
