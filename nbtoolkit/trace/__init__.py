"""Profiler traces: capture, read, analyse (overlap, breakdowns, critical path, roofline), draw."""
