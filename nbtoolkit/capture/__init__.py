"""Capture: run code under an instrument (profiler, compile events, memory) and return model objects."""
