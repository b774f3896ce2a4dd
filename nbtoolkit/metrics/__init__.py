"""Step metrics: model FLOPs, device peaks, MFU/HFU of a measured step."""
