"""Integrations with other training libraries (DeepSpeed)."""
