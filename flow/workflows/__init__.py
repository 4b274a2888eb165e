"""Workflows over the stack: the demo, retraining, scheduling, a trainer beside a Spark job,
and the synthetic data they run on."""
