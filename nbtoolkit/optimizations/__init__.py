"""Optimizations applied and measured: torch.compile, activation recomputation, AMP.

(Named ``optimizations`` rather than ``optimize`` so that importing it can never
shadow the public function ``nbtoolkit.optimize``.)
"""
