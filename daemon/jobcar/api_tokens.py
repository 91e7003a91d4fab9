"""The API's bearer tokens and their roles (ADR 0026): which token a request carries (compared in constant time
with every token in force), what its role allows, and the table in force, which the daemon replaces on reload.

    read     the dashboard (read-only) and every read of the API (jobs, stats, limits, schedules)
    produce  POST /v1/jobs only: a producer reads no other job's payload
    operate  everything: the reads, enqueue, and every action (cancel, drain, schedules, the dashboard's buttons)

`api_token` is one operate token named `api_token`; `api_tokens` adds named ones, each from the file or from a
file it names (`token_file`). No token in force: the API is open, which the daemon allows on loopback only. A
token's name is what the log lines of its actions show; a token itself is never logged (nor in a repr).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from aiohttp import hdrs, web

from jobcar.config_types import LEGACY_TOKEN_NAME, Config


class Role(StrEnum):
    READ = "read"
    PRODUCE = "produce"
    OPERATE = "operate"


#: What each role may do: operate includes read and produce; read and produce are apart.
_ALLOWED: Final[Mapping[Role, frozenset[Role]]] = {
    Role.READ: frozenset({Role.READ}),
    Role.PRODUCE: frozenset({Role.PRODUCE}),
    Role.OPERATE: frozenset(Role),
}
#: Who a request came from while no token is in force (the open API on loopback).
ANONYMOUS: Final = "anonymous"
#: Where a request keeps the name of the token it came with (request[CALLER]), for the log lines of its actions.
CALLER: Final = web.RequestKey("jobcar.caller", str)


def allows(role: Role, needed: Role) -> bool:
    return needed in _ALLOWED[role]


@dataclass(frozen=True, slots=True)
class ApiToken:
    name: str
    role: Role
    #: Never shown: not in a repr, never logged.
    secret: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class TokenTable:
    """The tokens in force. Empty: the API is open."""

    tokens: tuple[ApiToken, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def match(self, given: str) -> ApiToken | None:
        """The token `given` is, compared with every token in force in constant time (no early exit: how long it
        takes does not say which token matched, nor how much of one)."""
        found = None
        given_bytes = given.encode("utf-8", "surrogatepass")
        for token in self.tokens:
            if hmac.compare_digest(given_bytes, token.secret.encode("utf-8", "surrogatepass")):
                found = token
        return found

    def bearer(self, authorization: str | None) -> ApiToken | None:
        """The token of an `Authorization: Bearer <token>` header, or None."""
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.match(given.strip())

    def named(self, name: str) -> ApiToken | None:
        return next((t for t in self.tokens if t.name == name), None)

    def names(self) -> str:
        """`name (role), ...` for a log line; never the tokens."""
        return ", ".join(f"{t.name} ({t.role.value})" for t in self.tokens) or "none (the API is open)"


class Tokens:
    """The table in force, one object shared by the API and the dashboard: the daemon replaces `table` on reload,
    and every request reads it anew."""

    def __init__(self, table: TokenTable) -> None:
        self.table = table


def token_table(config: Config) -> TokenTable:
    """The config's tokens: `api_token` (operate) and `api_tokens`. A token whose file could not be read by a
    command that runs no daemon (secrets not needed) has no value and is left out: it matches nothing."""
    tokens = [ApiToken(LEGACY_TOKEN_NAME, Role.OPERATE, config.api_token)] if config.api_token else []
    tokens += [ApiToken(t.name, Role(t.role), t.token) for t in config.api_tokens if t.token]
    return TokenTable(tuple(tokens))


def caller(request: web.Request) -> str:
    """The name of the token the request came with (for a log line), or `anonymous` on the open API."""
    return str(request.get(CALLER, ANONYMOUS))


def required_role(method: str, path: str) -> Role:
    """What a route of the API needs: reads need read, `POST /v1/jobs` produce, every other write operate (so a
    route added later is an operator's until said otherwise)."""
    if method in (hdrs.METH_GET, hdrs.METH_HEAD):
        return Role.READ
    if method == hdrs.METH_POST and path == "/v1/jobs":
        return Role.PRODUCE
    return Role.OPERATE
