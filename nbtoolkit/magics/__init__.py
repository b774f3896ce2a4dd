"""The ``%nbt`` / ``%%nbt`` magics: a thin layer over the public API.

Each non-underscore module in this package registers one or more subcommands
with :func:`nbtoolkit.magics._registry.register` when imported. The dispatcher
imports them all on ``%load_ext``, so these modules must import nothing heavy
at module level (no torch, ray, plotly...): they import the API inside handlers.
"""
