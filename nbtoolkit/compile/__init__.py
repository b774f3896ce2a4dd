"""torch.compile: capture graphs, read TORCH_TRACE logs, graph breaks, recompiles, figures."""
