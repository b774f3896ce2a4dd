"""Memory: timelines by category, allocator snapshots, peaks, diffs, figures."""
