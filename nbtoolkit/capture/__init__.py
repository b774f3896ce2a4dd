"""Capture: run code under an instrument (profiler, compile events, memory recorder) and return model objects."""
