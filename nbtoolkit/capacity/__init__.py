"""Will a training configuration fit, and which way is fastest: ``nbt.fit`` (see :mod:`.api`)."""
