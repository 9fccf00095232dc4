"""What a worker does with a claimed row (a Python callable or a shell command, given as text),
and why a render failed.

A render is named, not passed, so that a worker started by spawn or forkserver (which pickles
nothing but its arguments) and a worker restarted by the supervisor build the same one:
``"module:function"`` is imported in the worker and called with the row's URL and its
``Claim``; a command template (``curl -fsS {url} -o /dev/null``) is split like a shell line
once, and ``{url}`` (also ``{row}``, ``{lane}``) is filled into each argument, so a URL is one
argument and never reaches a shell. Raising, a non-zero exit status or a timeout is a failure.

Why it failed
-------------

"7 failures" says nothing; a 404, a typo in the command and a bug in a render function need
different people. :func:`classify` turns the exception a render raised into a :class:`Failure`:
a one-line ``reason`` for the operator and a ``permanent`` verdict for the scheduler (a
permanent failure will fail again however often it is retried; a transient one may not). The
rules, in order of what is looked at:

* **The reason.** A command that exited non-zero: ``"<cmd> exited <status>"`` and the last
  non-empty line of its stderr (where curl and wget put their verdict; progress meters and
  banners come before it). A command killed by a signal: ``"<cmd> killed by SIGKILL"``. A
  command that timed out: ``"timed out after <t> s"``. A command that cannot be started:
  ``"cannot run the render command <cmd>: <OS error>"``. Any other exception:
  ``"<Type>: <message>"`` (the message alone where the exception's class says it is written as
  a reason, ``bare_reason``: ``content check: #price missing``). Whitespace is folded to one
  line of at most ``REASON_MAX`` chars.
* **Timeouts and unrunnable commands are always transient.** A timeout may pass. A command
  that cannot be started is a mistake in the pool's configuration, not in the row: calling it
  permanent would park every row of the corpus, so it is transient (kind ``"missing"``) and its
  reason names the command, for the supervisor to report loudly.
* **HTTP 4xx is permanent, except 408 (request timeout) and 429 (too many requests).** The
  status is read from a command's last stderr line (curl's ``The requested URL returned error:
  404``, wget's ``ERROR 404: Not Found.``, see ``_HTTP_STATUS_PATTERNS``) or from an exception's
  ``status_code``, ``status`` or ``code`` attribute or its ``response.status_code``
  (``requests.HTTPError``, ``urllib.error.HTTPError``, ``httpx.HTTPStatusError``) when that is an
  int in 100..599. Any other status (5xx, 408, 429) is transient.
* **A render's own conventions.** An exit status listed in ``permanent_exits`` (say a render
  script exits 3 for "this page is gone") is permanent; an exception whose class, or any of its
  base classes, is named in ``permanent_errors`` by its name (``PageGone``) or qualified name
  (``myrenders.errors.PageGone``) is permanent.
* **Everything else is transient.** For an exit or an exception, a permanent verdict from any
  of the rules above stands (a 429 from a script whose exit status is listed is permanent).
"""

from __future__ import annotations

import importlib
import re
import shlex
import signal
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..api import Claim
from ..checks import is_int
from ..errors import EngineError, EngineTypeError, EngineValueError

RenderFn = Callable[[str, Claim], object]

FIELDS = ("url", "row", "lane")
"""The fields a command template may use."""

REASON_MAX = 300
"""A reason is cut to this many characters (a whole stderr or traceback belongs in a log)."""

KINDS = ("exit", "missing", "timeout", "exception")

_HTTP_STATUS_PATTERNS = (
    # curl -f: "curl: (22) The requested URL returned error: 404" (7.8x and 8.x); older curl
    # appends the reason phrase: "... returned error: 404 Not Found".
    re.compile(r"The requested URL returned error: (\d{3})\b"),
    # wget: "2026-12-03 13:55:55 ERROR 404: Not Found." (the last line of its stderr, -nv or not)
    re.compile(r"\bERROR (\d{3}): "),
)
_TRANSIENT_4XX = frozenset({408, 429})


class RenderFailed(EngineError):
    """A command render exited non-zero, timed out or could not be started.

    ``kind`` is ``"exit"``, ``"timeout"`` or ``"missing"`` (``None`` when raised by other code
    with a message only); ``command`` the program run; ``exit_status`` its exit status
    (negative: killed by that signal, as ``subprocess`` reports it); ``last_line`` the last
    non-empty line of its stderr, or for ``"missing"`` the OS error; ``timeout_s`` the limit it
    ran into.
    """

    def __init__(self, message: str, *, kind: str | None = None, command: str = "",
                 exit_status: int | None = None, last_line: str = "",
                 timeout_s: float | None = None) -> None:
        super().__init__(message)
        self.kind, self.command, self.exit_status = kind, command, exit_status
        self.last_line, self.timeout_s = last_line, timeout_s

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickling replays only ``args``; the attributes are keyword-only.
        return (_rebuild_render_failed, (str(self), self.kind, self.command, self.exit_status,
                                         self.last_line, self.timeout_s))


def _rebuild_render_failed(message: str, kind: str | None, command: str,
                           exit_status: int | None, last_line: str,
                           timeout_s: float | None) -> RenderFailed:
    return RenderFailed(message, kind=kind, command=command, exit_status=exit_status,
                        last_line=last_line, timeout_s=timeout_s)


@dataclass(frozen=True)
class Failure:
    """Why one render failed: what the failure log keeps and the operator reads."""

    reason: str
    """One line, at most ``REASON_MAX`` characters."""
    kind: str
    """``"exit"`` (non-zero status or a signal), ``"missing"`` (the command cannot be started),
    ``"timeout"`` or ``"exception"`` (a render callable raised)."""
    permanent: bool
    """Retrying will not help (a 404, a render's own 'gone' convention)."""
    exit_status: int | None = None
    http_status: int | None = None


def classify(exc: BaseException, permanent_exits: frozenset[int] = frozenset(),
             permanent_errors: frozenset[str] = frozenset()) -> Failure:
    """The :class:`Failure` a render's exception stands for (rules in the module docstring)."""
    if isinstance(exc, RenderFailed) and exc.kind in ("exit", "timeout", "missing"):
        cmd = exc.command or "the render command"
        if exc.kind == "timeout":
            return Failure(f"timed out after {exc.timeout_s:g} s" if exc.timeout_s is not None
                           else f"{cmd} timed out", "timeout", False)
        if exc.kind == "missing":
            return Failure(_one_line(f"cannot run the render command {cmd}: {exc.last_line}"),
                           "missing", False)
        status = exc.exit_status
        http = _http_status_in(exc.last_line)
        if status is not None and status < 0:
            head = f"{cmd} killed by {_signal_name(-status)}"
        else:
            head = f"{cmd} exited {status}"
        reason = _one_line(f"{head}: {exc.last_line}" if exc.last_line else head)
        permanent = (_permanent_http(http) or (status is not None and status in permanent_exits)
                     or _named_in(exc, permanent_errors))
        return Failure(reason, "exit", permanent, status, http)
    text = str(exc)
    if getattr(exc, "bare_reason", False) and text.strip():
        reason = _one_line(text)  # a message written as the reason ("content check: ...")
    else:
        reason = _one_line(f"{type(exc).__name__}: {text}" if text.strip()
                           else type(exc).__name__)
    http = _http_status_of(exc)
    return Failure(reason, "exception", _permanent_http(http) or _named_in(exc, permanent_errors),
                   None, http)


def _one_line(text: str, limit: int = REASON_MAX) -> str:
    flat = "".join(c if c.isprintable() else " " for c in " ".join(text.split()))
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _last_line(stderr: bytes) -> str:
    for line in reversed(stderr.decode(errors="replace").splitlines()):  # \r too: progress bars
        if line.strip():
            return _one_line(line)
    return ""


def _http_status_in(line: str) -> int | None:
    for pattern in _HTTP_STATUS_PATTERNS:
        m = pattern.search(line)
        if m and 100 <= int(m.group(1)) <= 599:
            return int(m.group(1))
    return None


def _http_status_of(exc: BaseException) -> int | None:
    """An HTTP status carried by an exception, the way the common client libraries carry it."""
    candidates = [getattr(exc, a, None) for a in ("status_code", "status", "code")]
    candidates.append(getattr(getattr(exc, "response", None), "status_code", None))
    for v in candidates:
        if is_int(v) and 100 <= v <= 599:
            return v
    return None


def _permanent_http(status: int | None) -> bool:
    return status is not None and 400 <= status <= 499 and status not in _TRANSIENT_4XX


def _named_in(exc: BaseException, names: frozenset[str]) -> bool:
    if not names:
        return False
    return any(c.__name__ in names or c.__qualname__ in names
               or f"{c.__module__}.{c.__qualname__}" in names for c in type(exc).__mro__)


def load_callable(spec: str) -> RenderFn:
    """Import ``"package.module:function"`` (a dotted attribute path after the colon)."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise EngineValueError(f"render must look like 'module:function', got {spec!r}")
    module_name, attr = spec.split(":")
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise EngineValueError(f"render {spec!r}: {module_name!r} is not a module name")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as e:
        raise EngineValueError(f"cannot import render module {module_name!r}: {e}") from None
    for part in attr.split("."):
        if not part.isidentifier() or not hasattr(obj, part):
            raise EngineValueError(f"render {spec!r}: {module_name} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EngineTypeError(f"render {spec!r} is not callable")
    return obj


def _fill(argv: list[str], url: str, row: int, lane: int) -> list[str]:
    return [a.format(url=url, row=row, lane=lane) for a in argv]


def _template_error(template: str, arg: str, e: Exception) -> EngineValueError:
    """Why ``arg`` of a command template does not format, with the way to write braces."""
    fields = ", ".join(f"{{{f}}}" for f in FIELDS)
    if isinstance(e, KeyError):
        field = str(e.args[0]) if e.args else "?"
        what = f"unknown field {{{field}}}"
        # Double the braces of the unknown field only: {url} etc. stay fields.
        fixed = re.sub(r"\{(" + re.escape(field) + r"[^{}]*)\}", r"{{\1}}", arg)
    elif isinstance(e, IndexError):
        what, fixed = "a positional field {} or {0}", arg.replace("{", "{{").replace("}", "}}")
    else:
        what, fixed = f"{e}", _escape_literal_braces(arg)
    return EngineValueError(
        f"bad render command {template!r}: {what} in argument {arg!r} (the fields are {fields};"
        f" write a literal brace doubled, {{{{ }}}}: {shlex.quote(fixed)})")


def _escape_literal_braces(arg: str) -> str:
    """``arg`` with every brace doubled except those of the known fields."""
    parts = re.split(r"(\{(?:" + "|".join(FIELDS) + r")\})", arg)
    return "".join(p if i % 2 else p.replace("{", "{{").replace("}", "}}")
                   for i, p in enumerate(parts))


@dataclass(frozen=True)
class CommandRender:
    """Run a command per row: ``{url}``, ``{row}`` and ``{lane}`` filled into its arguments."""

    template: str
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.template, str) or not self.template.strip():
            raise EngineValueError("the render command is empty")
        try:
            argv = shlex.split(self.template)
        except ValueError as e:
            raise EngineValueError(f"bad render command {self.template!r}: {e}") from None
        for arg in argv:
            try:
                arg.format(url="u", row=0, lane=0)
            except (KeyError, IndexError, ValueError, AttributeError, TypeError) as e:
                raise _template_error(self.template, arg, e) from None
        marker = "\x00url\x00"  # a URL never holds NUL: where it shows, {url} was used
        if not any(marker in a for a in _fill(argv, marker, 0, 0)):
            raise EngineValueError(f"render command {self.template!r} never uses {{url}}")
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s <= 86_400):
            raise EngineValueError(f"render timeout must lie in (0, 86400] s, got"
                                   f" {self.timeout_s!r}")

    def __call__(self, url: str, claim: Claim) -> None:
        argv = _fill(shlex.split(self.template), url, claim.row, claim.lane)
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise RenderFailed(f"{argv[0]} timed out after {self.timeout_s:g} s on {url}",
                               kind="timeout", command=argv[0],
                               timeout_s=self.timeout_s) from None
        except OSError as e:
            error = f"[Errno {e.errno}] {e.strerror}" if e.errno else str(e)
            raise RenderFailed(f"cannot run {argv[0]}: {error}", kind="missing",
                               command=argv[0], last_line=error) from None
        if done.returncode != 0:
            last = _last_line(done.stderr)
            raise RenderFailed(f"{argv[0]} exited {done.returncode} on {url}: {last}",
                               kind="exit", command=argv[0], exit_status=done.returncode,
                               last_line=last)


@dataclass(frozen=True)
class RenderSpec:
    """A render as text: exactly one of ``callable`` and ``command``. Picklable.

    ``permanent_exits`` (exit statuses 1..255) and ``permanent_errors`` (exception class names,
    plain or dotted) are the render's own ways of saying "this row will never render": see
    :func:`classify`.
    """

    callable: str | None = None
    command: str | None = None
    timeout_s: float = 60.0
    permanent_exits: tuple[int, ...] = ()
    permanent_errors: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.callable is None) == (self.command is None):
            raise EngineValueError("give a render as module:function or as a command, not both")
        # Frozen: the normalised tuples are set the way dataclasses set fields.
        object.__setattr__(self, "permanent_exits", _exit_statuses(self.permanent_exits))
        object.__setattr__(self, "permanent_errors", _error_names(self.permanent_errors))
        self.build()  # fail in the supervisor, before any worker starts

    def build(self) -> RenderFn:
        if self.command is not None:
            return CommandRender(self.command, self.timeout_s)
        assert self.callable is not None
        return load_callable(self.callable)

    def classify(self, exc: BaseException) -> Failure:
        """:func:`classify` under this render's conventions."""
        return classify(exc, frozenset(self.permanent_exits), frozenset(self.permanent_errors))


def _exit_statuses(values: Iterable[int]) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise EngineValueError(f"permanent_exits must be a sequence of ints, got {values!r}")
    out = tuple(values)
    bad = [v for v in out if not (is_int(v) and 1 <= v <= 255)]
    if bad:
        raise EngineValueError(f"permanent_exits must be exit statuses in 1..255, got {bad[0]!r}")
    return out


def _error_names(values: Iterable[str]) -> tuple[str, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise EngineValueError(f"permanent_errors must be a sequence of class names, got"
                               f" {values!r}")
    out = tuple(values)
    bad = [v for v in out if not (isinstance(v, str)
                                  and all(p.isidentifier() for p in v.split(".")))]
    if bad:
        raise EngineValueError(f"permanent_errors holds {bad[0]!r}: not a class name"
                               " (an identifier, or dotted like module.Class)")
    return out

