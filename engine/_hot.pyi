# Types of engine._hot (csrc/hot.c): the engine's hot calls as CPython methods.
from typing import Any

import numpy as np
import numpy.typing as npt

DEFAULT_BUDGET: int
DEFAULT_LEASE_MS: int
DEFAULT_WINDOW: int
MAX_BUDGET: int
MAX_WINDOW: int
ARENA: int

class ClaimsBase:
    @property
    def rows(self) -> npt.NDArray[np.int64]: ...
    @property
    def lanes(self) -> npt.NDArray[np.int64]: ...
    @property
    def due_ms(self) -> npt.NDArray[np.int64]: ...
    @property
    def tokens(self) -> npt.NDArray[np.int64]: ...
    def __len__(self) -> int: ...

class EngineBase:
    def claim(self, budget: int = 16, now_ms: int | None = None, lease_ms: int = 30000,
              window: int = 140) -> Any: ...
    def complete_many(self, rows: Any, tokens: Any, next_due_ms: Any = None,
                      now_ms: int | None = None) -> npt.NDArray[np.bool_]: ...
    def complete_and_claim(self, rows: Any, tokens: Any, budget: int = 16,
                           now_ms: int | None = None, lease_ms: int = 30000,
                           window: int = 140) -> tuple[npt.NDArray[np.bool_], Any]: ...
    def _set_request(self, request: Any, address: int) -> None: ...

def setup(claims_type: type[ClaimsBase], claim_req: int, complete_req: int,
          complete_claim_req: int) -> None: ...
