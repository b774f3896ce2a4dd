"""One HTML report of any results."""
