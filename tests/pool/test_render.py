"""Why a render failed: real curl and wget output against a local HTTP server, a missing binary,
a timeout, exceptions from render callables, and the command template's brace hint."""

from __future__ import annotations

import http.server
import pickle
import threading
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest

from engine import EngineValueError
from engine.pool.render import (
    REASON_MAX,
    CommandRender,
    Failure,
    RenderFailed,
    RenderSpec,
    classify,
)
from engine.shm.engine import Claim

CLAIM = Claim(row=7, token=1, lane=0, due_ms=0)


class _StatusHandler(http.server.BaseHTTPRequestHandler):
    """``GET /status/<code>`` answers with that status and a two-byte body."""

    def do_GET(self) -> None:
        self.send_response(int(self.path.rsplit("/", 1)[-1]))
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"x\n")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The base URL of a local server answering any status asked for."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StatusHandler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    thread.join()


def failure_of(render: Any, url: str, spec: RenderSpec | None = None) -> Failure:
    with pytest.raises(Exception) as info:
        render(url, CLAIM)
    return (spec or RenderSpec(command="true {url}")).classify(info.value)


def one_line(reason: str) -> bool:
    return "\n" not in reason and "\r" not in reason and len(reason) <= REASON_MAX


# make test installs curl and wget when they are missing: a missing one is a failure, not a skip.


@pytest.mark.parametrize("args", ["-fsS", "-f", "-sS --fail-with-body"])
def test_curl_404_is_permanent_with_its_http_status(server: str, args: str) -> None:
    f = failure_of(CommandRender(f"curl {args} {{url}} -o /dev/null", 10), f"{server}/status/404")
    assert f == Failure("curl exited 22: curl: (22) The requested URL returned error: 404",
                        "exit", True, 22, 404)


@pytest.mark.parametrize("status", [500, 503, 408, 429])
def test_curl_5xx_408_and_429_are_transient(server: str, status: int) -> None:
    f = failure_of(CommandRender("curl -fsS {url} -o /dev/null", 10), f"{server}/status/{status}")
    assert (f.kind, f.permanent, f.exit_status, f.http_status) == ("exit", False, 22, status)


def test_curl_connection_refused_is_transient_and_says_why() -> None:
    f = failure_of(CommandRender("curl -fsS {url} -o /dev/null", 10), "http://127.0.0.1:1/")
    assert f.reason.startswith("curl exited 7: curl: (7) Failed to connect to 127.0.0.1 port 1")
    assert (f.kind, f.permanent, f.exit_status, f.http_status) == ("exit", False, 7, None)


@pytest.mark.parametrize("args", ["", "-nv"])
@pytest.mark.parametrize("status, permanent", [(410, True), (404, True), (503, False)])
def test_wget_errors_carry_the_http_status(server: str, args: str, status: int,
                                           permanent: bool) -> None:
    f = failure_of(CommandRender(f"wget {args} -O /dev/null {{url}}", 10),
                   f"{server}/status/{status}")
    assert (f.kind, f.permanent, f.exit_status, f.http_status) == ("exit", permanent, 8, status)
    assert f"ERROR {status}:" in f.reason and one_line(f.reason)


def test_the_last_non_empty_stderr_line_makes_the_reason() -> None:
    script = r"printf 'banner\n  0%% progress\r100%% progress\n\nthe verdict\n\n' >&2; exit 4"
    f = failure_of(CommandRender(f"/bin/sh -c \"{script}\" {{url}}", 10), "u")
    assert f == Failure("/bin/sh exited 4: the verdict", "exit", False, 4, None)


def test_a_silent_failure_and_a_signal_have_short_reasons() -> None:
    assert failure_of(CommandRender("false {url}", 10), "u").reason == "false exited 1"
    f = failure_of(CommandRender("/bin/sh -c 'kill -9 $$' {url}", 10), "u")
    assert (f.reason, f.exit_status, f.permanent) == ("/bin/sh killed by SIGKILL", -9, False)


def test_a_long_or_odd_stderr_line_is_cut_to_one_line() -> None:
    f = failure_of(CommandRender("/bin/sh -c 'printf \"%0500d\\t\\033x\" 0 >&2; exit 1' {url}",
                                 10), "u")
    assert one_line(f.reason) and f.reason.endswith("...") and "\x1b" not in f.reason


def test_a_missing_binary_is_transient_and_names_the_command() -> None:
    f = failure_of(CommandRender("curlx -fsS {url}", 10), "http://example.invalid/")
    assert f == Failure("cannot run the render command curlx: [Errno 2] No such file or"
                        " directory", "missing", False)


def test_a_command_that_is_not_executable_is_missing_too(tmp_path: Any) -> None:
    script = tmp_path / "render.sh"
    script.write_text("#!/bin/sh\nexit 0\n")  # mode 0644
    f = failure_of(CommandRender(f"{script} {{url}}", 10), "u")
    assert (f.kind, f.permanent) == ("missing", False) and "Permission denied" in f.reason


def test_a_timeout_is_transient() -> None:
    f = failure_of(CommandRender("sleep 5 {url}", 0.2), "0")  # sleeps 5 + 0 s
    assert f == Failure("timed out after 0.2 s", "timeout", False)


def test_a_callable_raising_name_error_is_an_exception_with_its_message() -> None:
    def render(url: str, claim: Claim) -> None:
        x  # type: ignore[name-defined]  # noqa: B018, F821

    f = failure_of(render, "u")
    assert f == Failure("NameError: name 'x' is not defined", "exception", False)


def test_an_exception_without_a_message_is_named_by_its_type() -> None:
    assert classify(KeyboardInterrupt()).reason == "KeyboardInterrupt"
    assert classify(ValueError("two\nlines  here")).reason == "ValueError: two lines here"


def test_urllib_http_error_410_is_permanent_and_503_transient() -> None:
    gone = urllib.error.HTTPError("http://a.example/", 410, "Gone", {}, None)  # type: ignore[arg-type]
    f = classify(gone)
    assert f == Failure("HTTPError: HTTP Error 410: Gone", "exception", True, None, 410)
    busy = urllib.error.HTTPError("http://a.example/", 503, "Busy", {}, None)  # type: ignore[arg-type]
    assert (classify(busy).permanent, classify(busy).http_status) == (False, 503)


class _Response:
    def __init__(self, status_code: Any) -> None:
        self.status_code = status_code


class ClientHTTPError(Exception):
    """Like requests.HTTPError and httpx.HTTPStatusError: the status on ``.response``."""

    def __init__(self, status: Any) -> None:
        super().__init__(f"{status} Client Error")
        self.response = _Response(status)


class StatusCodeError(Exception):
    def __init__(self, status: Any) -> None:
        super().__init__("boom")
        self.status_code = status


@pytest.mark.parametrize("exc, http, permanent", [
    (ClientHTTPError(404), 404, True), (ClientHTTPError(429), 429, False),
    (ClientHTTPError(None), None, False), (StatusCodeError(451), 451, True),
    (StatusCodeError(408), 408, False), (StatusCodeError(True), None, False),
    (StatusCodeError(4040), None, False), (StatusCodeError("404"), None, False),
    (SystemExit(2), None, False)])
def test_an_http_status_is_read_from_the_usual_attributes(exc: BaseException, http: int | None,
                                                          permanent: bool) -> None:
    f = classify(exc)
    assert (f.kind, f.http_status, f.permanent) == ("exception", http, permanent)


class PageGone(LookupError):
    pass


class GoneForGood(PageGone):
    pass


@pytest.mark.parametrize("names", [("PageGone",), ("test_render.PageGone",),
                                   ("GoneForGood",), ("elsewhere.Nope", "LookupError")])
def test_a_user_named_exception_type_or_base_is_permanent(names: tuple[str, ...]) -> None:
    spec = RenderSpec(callable="pool_renders:record", permanent_errors=names)
    assert spec.classify(GoneForGood("https://a.example/ is gone")) == Failure(
        "GoneForGood: https://a.example/ is gone", "exception", True)
    assert not spec.classify(RuntimeError("other")).permanent


def test_a_name_in_another_module_is_not_the_same_class() -> None:
    spec = RenderSpec(callable="pool_renders:record", permanent_errors=("other.PageGone",))
    assert not spec.classify(PageGone()).permanent


def test_a_render_scripts_own_exit_status_is_permanent() -> None:
    spec = RenderSpec(command="/bin/sh -c 'echo gone >&2; exit 3' {url}", permanent_exits=(3,))
    f = failure_of(spec.build(), "u", spec)
    assert f == Failure("/bin/sh exited 3: gone", "exit", True, 3, None)
    other = RenderSpec(command="/bin/sh -c 'exit 4' {url}", permanent_exits=(3,))
    assert not failure_of(other.build(), "u", other).permanent


def test_a_render_failed_raised_by_other_code_is_an_exception() -> None:
    assert classify(RenderFailed("my own words")) == Failure("RenderFailed: my own words",
                                                             "exception", False)


def test_render_failed_keeps_its_attributes_through_pickle() -> None:
    with pytest.raises(RenderFailed) as info:
        CommandRender("/bin/sh -c 'echo no >&2; exit 5' {url}", 10)("u", CLAIM)
    back = pickle.loads(pickle.dumps(info.value))
    assert (back.kind, back.command, back.exit_status, back.last_line) == (
        "exit", "/bin/sh", 5, "no")
    assert str(back) == str(info.value) and classify(back) == classify(info.value)


def test_a_spec_with_conventions_pickles_and_compares_equal() -> None:
    spec = RenderSpec(command="curl -fsS {url}", permanent_exits=[3, 4],  # type: ignore[arg-type]
                      permanent_errors=["myrenders.Gone"])  # type: ignore[arg-type]
    assert spec.permanent_exits == (3, 4) and spec.permanent_errors == ("myrenders.Gone",)
    assert pickle.loads(pickle.dumps(spec)) == spec


@pytest.mark.parametrize("kw, match", [
    ({"permanent_exits": (0,)}, "1..255"), ({"permanent_exits": (256,)}, "1..255"),
    ({"permanent_exits": (True,)}, "1..255"), ({"permanent_exits": ("3",)}, "1..255"),
    ({"permanent_exits": 3}, "sequence of ints"),
    ({"permanent_errors": "PageGone"}, "sequence of class names"),
    ({"permanent_errors": ("Page Gone",)}, "not a class name"),
    ({"permanent_errors": ("a..B",)}, "not a class name"),
    ({"permanent_errors": (3,)}, "not a class name")])
def test_bad_conventions_are_refused(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(EngineValueError, match=match):
        RenderSpec(command="true {url}", **kw)


def test_an_unknown_template_field_is_named_with_the_doubled_brace_hint() -> None:
    with pytest.raises(EngineValueError) as info:
        RenderSpec(command="curl -w '%{http_code}' {url}")
    text = str(info.value)
    assert "unknown field {http_code}" in text and "{{ }}" in text
    assert "'%{{http_code}}'" in text
    spec = RenderSpec(command="curl -o /dev/null -w '%{{http_code}}' {url}")
    assert spec.command is not None


@pytest.mark.parametrize("template", ["echo } {url}", "echo {} {url}", "echo {url.x}"])
def test_other_template_mistakes_give_the_brace_hint(template: str) -> None:
    with pytest.raises(EngineValueError, match=r"bad render command.*\{\{ \}\}"):
        CommandRender(template)


@pytest.mark.parametrize("template", ["echo hello", "echo {{url}}", "echo {row} {lane}"])
def test_a_template_that_never_uses_url_is_refused(template: str) -> None:
    with pytest.raises(EngineValueError, match="never uses"):
        CommandRender(template)


def test_fields_are_filled_into_single_arguments() -> None:
    spec = RenderSpec(command="/bin/sh -c 'test \"$0\" = \"a b;c\" && test $1 = 7' {url} {row}")
    spec.build()("a b;c", CLAIM)  # one argument each, no shell in between
