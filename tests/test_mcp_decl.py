"""adaptor.mcp: declarations, the validation order, and secrets kept out of sight."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptor import errors, mcp
from adaptor.driver import Descriptor, MCPCaps

SECRET = "tok-9f8e7d6c5b4a"


def caps(**kw: bool) -> Descriptor:
    values = {"supported": True, "stdio": True, "http": True, "sse": True, **kw}
    return Descriptor(type="fake", display_name="Fake", mcp=MCPCaps(**values))


ALL = caps()


def test_constructors_and_normalized_output() -> None:
    specs = mcp.validate(
        [
            mcp.http("web", " https://mcp.example.com/mcp ", {"X-Key": SECRET}, "WEB_TOKEN"),
            mcp.stdio("files", "npx", ["-y", "server"], {"ROOT": "/srv"}),
            mcp.sse("legacy", "http://127.0.0.1:9/sse"),
        ],
        ALL,
    )
    assert [s.key for s in specs] == ["files", "legacy", "web"]  # sorted by key
    files, legacy, web = specs
    assert (
        files.transport == "stdio"
        and files.args == ("-y", "server")
        and files.env == {"ROOT": "/srv"}
    )
    assert web.url == "https://mcp.example.com/mcp" and web.bearer_token_env == "WEB_TOKEN"
    assert web.headers == {"X-Key": SECRET}
    assert legacy.transport == "sse"


def test_empty_sets_validate_to_nothing_on_any_driver() -> None:
    no_mcp = caps(supported=False)
    assert mcp.validate(None, no_mcp) == ()
    assert mcp.validate([], no_mcp) == ()


def test_transport_is_case_insensitive() -> None:
    (spec,) = mcp.validate([mcp.Server(key="a", transport=" HTTP ", url="http://x/")], ALL)
    assert spec.transport == "http"


INVALID: list[tuple[str, Any]] = [
    ("missing key", mcp.stdio(" ", "cmd")),
    ("bad key", mcp.stdio("has space", "cmd")),
    ("reserved key", mcp.stdio("adaptor", "cmd")),
    ("unknown transport", mcp.Server(key="a", transport="ftp", url="ftp://x")),
    ("no transport", mcp.Server(key="a", transport="")),
    ("stdio without command", mcp.stdio("a", "  ")),
    ("stdio with url", mcp.Server(key="a", transport="stdio", command="c", url="http://x")),
    ("stdio with headers", mcp.Server(key="a", transport="stdio", command="c", headers={"A": "b"})),
    (
        "stdio with bearer",
        mcp.Server(key="a", transport="stdio", command="c", bearer_token_env="T"),
    ),
    ("http without url", mcp.http("a", "")),
    ("http with relative url", mcp.http("a", "/mcp")),
    ("http with other scheme", mcp.http("a", "file:///etc/passwd")),
    ("http with command", mcp.Server(key="a", transport="http", url="http://x", command="c")),
    ("sse with env", mcp.Server(key="a", transport="sse", url="http://x", env={"A": "b"})),
    ("bad env name", mcp.stdio("a", "c", env={"1BAD": "x"})),
    ("env value with NUL", mcp.stdio("a", "c", env={"A": "x\0y"})),
    ("header with newline", mcp.http("a", "http://x", headers={"X": "a\r\nInjected: 1"})),
    ("bad header name", mcp.http("a", "http://x", headers={"Bad Header": "v"})),
    ("bad bearer name", mcp.http("a", "http://x", bearer_token_env="not a name")),
    ("one header twice in two cases", mcp.http("a", "http://x", {"X-Key": SECRET, "x-key": "b"})),
    ("bearer and authorization", mcp.http("a", "http://x", {"authorization": "x"}, "T")),
    ("args not strings", mcp.Server(key="a", transport="stdio", command="c", args=(1,))),  # type: ignore[arg-type]
    ("args a string", mcp.Server(key="a", transport="stdio", command="c", args="abc")),
    ("required not bool", mcp.Server(key="a", transport="stdio", command="c", required="yes")),  # type: ignore[arg-type]
    (
        "gateway token alias",
        mcp.http("a", "http://x", bearer_token_env=mcp.RESERVED_ENV_PREFIX + "AB"),
    ),
    (
        "gateway token expansion",
        mcp.http("a", "http://x", {"X": "${" + mcp.RESERVED_ENV_PREFIX + "AB}"}),
    ),
    # ${VAR} in a stdio command is expanded by the CLI too: the token would sit in argv (ps).
    ("gateway token in command", mcp.stdio("a", "${" + mcp.RESERVED_ENV_PREFIX + "AB}")),
    ("gateway token in args", mcp.stdio("a", "c", ["--token=${" + mcp.RESERVED_ENV_PREFIX + "AB}"])),
    # Set to another value, they hid the server's processes from the run's clean-up.
    ("the run's mark in env", mcp.stdio("a", "c", env={"ADAPTOR_RUN_MARK": "x"})),
    ("the starter in env", mcp.stdio("a", "c", env={"ADAPTOR_STARTED_BY": "1:2"})),
    ("url with a space", mcp.http("a", "http://mcp example.com/mcp")),
    ("url with a tab", mcp.sse("a", "http://mcp.example.com/a\tb")),
    ("url with a word for port", mcp.http("a", "http://mcp.example.com:port/mcp")),
    ("url with port out of range", mcp.http("a", "http://mcp.example.com:65536/mcp")),
    ("url with port 0", mcp.sse("a", "http://127.0.0.1:0/sse")),
    ("url without host", mcp.http("a", "http://:8080/mcp")),
    ("url with only a user", mcp.http("a", "https://" + SECRET + "@/mcp")),
    ("url with broken ipv6", mcp.http("a", "http://[::1/mcp")),
    ("not a declaration", 42),
    ("json with unknown field", {"key": "a", "transport": "stdio", "command": "c", "cwd": "/"}),
]


@pytest.mark.parametrize("what,server", INVALID, ids=[i[0] for i in INVALID])
def test_invalid_declarations(what: str, server: Any) -> None:
    with pytest.raises(mcp.InvalidMCPConfigError) as caught:
        mcp.validate([server], ALL)
    assert caught.value.code == "ErrInvalidMCPConfig"
    assert SECRET not in str(caught.value)
    repr(server)  # works for an invalid declaration too (a log line may show it)


MISTYPED: list[tuple[str, Callable[[], mcp.Server]]] = [
    # The constructors made these six one-letter arguments and {"A": "B"}, and the run went on,
    # or failed with dict()'s "dictionary update sequence element #0 has length 1".
    ("stdio args a string", lambda: mcp.stdio("a", "c", "--flag")),
    ("stdio env a list of letter pairs", lambda: mcp.stdio("a", "c", env=["AB"])),  # type: ignore[arg-type]
    ("http headers a string", lambda: mcp.http("a", "http://x", "X-Key: v")),  # type: ignore[arg-type]
    ("sse headers a list of pairs", lambda: mcp.sse("a", "http://x", [("X", "v")])),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("what,make", MISTYPED, ids=[m[0] for m in MISTYPED])
def test_constructors_keep_mistyped_values_for_validation_to_refuse(
    what: str, make: Callable[[], mcp.Server]
) -> None:
    with pytest.raises(mcp.InvalidMCPConfigError, match="must be a list of strings|must map names"):
        mcp.validate([make()], ALL)


def test_secret_values_of_a_list_given_as_env_stay_out_of_the_repr() -> None:
    server = mcp.stdio("a", "c", env=[("TOKEN", SECRET)])  # type: ignore[arg-type]
    assert SECRET not in repr(server)
    assert "env=<not a mapping: list>" in repr(server)


def test_urls_with_hosts_and_ports_in_range_are_accepted() -> None:
    urls = ["http://[::1]:8080/mcp", "https://mcp.example.com:65535/mcp", "http://h:1/sse", "http://h:/x"]
    specs = mcp.validate([mcp.http(f"s{i}", url) for i, url in enumerate(urls)], ALL)
    assert [s.url for s in specs] == urls


def test_duplicate_keys() -> None:
    with pytest.raises(mcp.InvalidMCPConfigError, match="duplicate"):
        mcp.validate([mcp.stdio("a", "x"), mcp.http(" a ", "http://x")], ALL)


def test_validation_order() -> None:
    bad = mcp.stdio("", "x")
    sse = mcp.sse("legacy", "http://x")
    no_mcp = caps(supported=False)
    no_sse = caps(sse=False)
    # a malformed declaration is reported on every driver, before capabilities
    with pytest.raises(mcp.InvalidMCPConfigError):
        mcp.validate([sse, bad], no_mcp)
    with pytest.raises(mcp.MCPUnsupportedError):
        mcp.validate([sse], no_mcp)
    with pytest.raises(mcp.MCPTransportUnsupportedError, match="sse"):
        mcp.validate([mcp.stdio("a", "x"), sse], no_sse)
    assert mcp.validate([mcp.stdio("a", "x")], no_sse)


def test_tools_need_http_mcp() -> None:
    assert mcp.validate(None, ALL, tools=True) == ()
    with pytest.raises(mcp.MCPUnsupportedError, match="host-defined tools"):
        mcp.validate(None, caps(supported=False), tools=True)
    with pytest.raises(mcp.MCPTransportUnsupportedError, match="host-defined tools"):
        mcp.validate(None, caps(http=False), tools=True)


def test_secrets_stay_out_of_reprs_and_fingerprints() -> None:
    declared = [
        mcp.stdio("files", "npx", ["server"], {"API_KEY": SECRET}),
        mcp.http("web", "https://x/mcp", {"X-Key": SECRET}, "WEB_TOKEN"),
    ]
    for server in declared:
        assert SECRET not in repr(server)
    specs = mcp.validate(declared, ALL)
    for spec in specs:
        assert SECRET not in repr(spec)
    rotated = mcp.validate(
        [
            mcp.stdio("files", "npx", ["server"], {"API_KEY": "other"}),
            mcp.http("web", "https://x/mcp", {"X-Key": "other"}, "WEB_TOKEN"),
        ],
        ALL,
    )
    # secret values rotate freely; names are part of the identity
    assert mcp.fingerprint(specs) == mcp.fingerprint(rotated)
    renamed = mcp.validate([mcp.stdio("files", "npx", ["server"], {"OTHER_KEY": SECRET})], ALL)
    assert mcp.fingerprint(renamed) != mcp.fingerprint(specs[:1])
    assert mcp.fingerprint(specs) != mcp.fingerprint(specs[:1])
    assert mcp.fingerprint(specs) == mcp.fingerprint(reversed(specs))


def test_from_json_round_trip() -> None:
    obj = {"key": "a", "transport": "http", "url": "http://x", "headers": {"H": "v"}}
    (spec,) = mcp.validate([obj], ALL)
    assert spec.headers == {"H": "v"}
    assert mcp.from_json(mcp.stdio("a", "c")) == mcp.stdio("a", "c")


def test_errors_are_in_the_taxonomy() -> None:
    for cls in (
        mcp.InvalidMCPConfigError,
        mcp.MCPUnsupportedError,
        mcp.MCPTransportUnsupportedError,
    ):
        assert type(errors.from_wire(cls("m").to_wire())) is cls
        assert errors.exit_code_for(cls()) == 3


@given(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", fullmatch=True).filter(
        lambda k: k != "adaptor"
    )
)
def test_every_pattern_key_is_valid(key: str) -> None:
    (spec,) = mcp.validate([mcp.stdio(key, "c")], ALL)
    assert spec.key == key


@given(
    st.dictionaries(
        st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True),
        st.text().filter(lambda t: "\0" not in t).map(lambda t: "SECRETVALUE" + t),
        min_size=1,
    )
)
def test_env_values_never_leak(env: dict[str, str]) -> None:
    (spec,) = mcp.validate([mcp.stdio("a", "c", env=env)], ALL)
    shown = repr(spec) + repr(mcp.stdio("a", "c", env=env)) + mcp.fingerprint([spec])
    assert "SECRETVALUE" not in shown
