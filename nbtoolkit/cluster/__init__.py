"""Cluster: the only package that knows Ray; runs a feature's capture on remote ranks, ships results back."""
