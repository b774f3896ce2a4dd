"""Memory tests import torch at collection time.

Importing torch for the first time installs its logging handlers (torch._dynamo,
torch.__trace ...); the repository-wide no-instrument fixture would otherwise see those
appear during whichever memory test happens to import torch first.
"""

from __future__ import annotations

import torch  # noqa: F401
