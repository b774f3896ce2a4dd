"""Views: figures, widgets and HTML for model objects. Plotting libraries are imported inside functions."""
