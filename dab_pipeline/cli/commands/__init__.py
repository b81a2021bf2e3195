"""The click commands.  Each resolves a stage config once, then calls the stage."""

from __future__ import annotations

from .calibrating import calibrate  # noqa: F401
from .evaluating import compare, evaluate  # noqa: F401
from .extracting import extract, inspect  # noqa: F401
from .indexing import index  # noqa: F401
from .searching import search  # noqa: F401
from .serving import serve  # noqa: F401
from .sweeping import sweep  # noqa: F401
from .training import distill, train  # noqa: F401
