"""Host state of the rollout side (generated rows, queues) as text for a checkpoint's ``extra``
(JSON): pickled, then base64. A checkpoint is trusted as the run that wrote it."""

from __future__ import annotations

import base64
import pickle
from typing import Any


def packed(state: Any) -> str:
    """`state` as text."""
    return base64.b64encode(pickle.dumps(state)).decode("ascii")


def unpacked(text: str) -> Any:
    """The state `packed` wrote."""
    return pickle.loads(base64.b64decode(text))
