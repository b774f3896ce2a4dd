"""Readers of files made by other tools: Kineto traces, TORCH_TRACE logs, allocator snapshots."""
