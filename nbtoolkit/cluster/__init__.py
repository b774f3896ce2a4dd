"""Cluster: the only layer that knows Ray; runs capture on remote ranks and ships model objects back."""
