"""HTA's kernel types of device event names, and the names of host communication calls.

Pure name rules (rule 3 of :mod:`nbtoolkit.trace._kernels`), below the Trace: the timeline
figure and the analyses classify names the same way.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["COMMUNICATION", "COMM_PREFIXES", "COMPUTATION", "MEMORY", "OTHER", "kernel_type", "kernel_types"]

#: host operators that are communication calls (gloo, c10d, NCCL, HCCL ...)
COMM_PREFIXES = ("gloo:", "c10d", "nccl:", "record_param_comms", "ProcessGroup", "_c10d", "hccl:")
COMMUNICATION = "COMMUNICATION"
MEMORY = "MEMORY"
COMPUTATION = "COMPUTATION"
OTHER = "OTHER"

# HTA's rule is ``^nccl.*Kernel`` (NCCL, and RCCL, whose kernels keep NCCL's names); HCCL
# kernels (Habana/Ascend collectives) are added: no HTA reference trace has such names.
_COMM_RE = re.compile(r"^nccl.*Kernel|^(hccl|Hccl|HCCL|hcom_)")
_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
_SYNC_NAMES = ("Event Sync", "Context Sync")


@lru_cache(maxsize=1 << 16)
def kernel_type(name: str) -> str:
    """HTA's kernel type of one device event name (cached: hundreds of ranks share their kernel names)."""
    if _COMM_RE.match(name):
        return COMMUNICATION
    if _MEMORY_RE.match(name):
        return MEMORY
    if _NOT_COMPUTE_RE.match(name):
        return OTHER
    return COMPUTATION


def kernel_types(names: pd.Series) -> np.ndarray:
    """Kernel type per row of a categorical name column (classified once per distinct name)."""
    return kernel_type_table(names.cat.categories)[names.cat.codes.to_numpy()]


def kernel_type_table(categories: pd.Index | np.ndarray) -> np.ndarray:
    """Kernel type per category code of a name column, plus a trailing OTHER for code -1 (missing).

    ``categories``: a pandas Index or a numpy array of names (the lean summarizer's).
    """
    return np.array(
        [kernel_type(str(c)) for c in np.asarray(categories, dtype=object)] + [OTHER], dtype=object
    )
