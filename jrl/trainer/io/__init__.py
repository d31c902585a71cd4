"""What a run writes: checkpoints, loggers (tracking) and the metrics it computes."""
