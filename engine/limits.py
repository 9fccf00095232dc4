"""A claim's defaults and bounds: a leaf module, so that both the contract (``engine.api``,
which re-exports them and where csrc/hot.c reads them) and the argument checks
(``engine.checks``) take them from one place without importing each other."""

DEFAULT_BUDGET = 16
"""Rows one claim pass leases unless told."""
DEFAULT_LEASE_MS = 30_000
"""How long a lease lasts unless told: a render that takes longer renews it."""
DEFAULT_WINDOW = 140
"""Due rows a claim pass looks at past each lane's head (the claim window)."""
MAX_BUDGET = 1 << 16
"""The largest budget of one claim pass."""
MAX_WINDOW = 1 << 30
"""The largest claim window."""
