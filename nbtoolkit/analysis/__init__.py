"""Analysis: pure functions, model objects or frames in, frames or model objects out. No I/O, no printing."""
