"""Plain-data result objects: frames inside dataclasses that save and load themselves.

Model modules import no widget or plotting code at module level.
"""
