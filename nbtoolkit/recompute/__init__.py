"""Optimizations and their measurement: compile, AMP, activation recomputation under a budget."""
