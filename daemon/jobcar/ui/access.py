"""Who may see the dashboard and who may act through it: the login cookie, the CSRF token every form carries,
the browser checks, and the headers every page is sent with (ADR 0017).

- With a token set (`api_token`, `api_tokens`), every page needs a session: a login form takes a token once and
  sets an HttpOnly, SameSite=Strict cookie holding an expiry, the token's name and their HMAC under that token
  (no token in URLs, nothing stored on the server, valid on every daemon of the fleet, void when the token
  changes, by a reload too). A bearer header is accepted too, for scripts.
- The token's role (api_tokens.py) says what the session may do: a `read` token sees every page and no button,
  and its POSTs are refused (403); acting needs both `ui.write` and an `operate` token; a `produce` token cannot
  sign in. An action's log line names the token.
- Without a token the daemon listens on loopback only (`listen.exposure_problem`), and the `Host` check of
  browser_guard.py stops a rebound DNS name.
- Every POST must come from the dashboard's own origin (`Origin`, `Sec-Fetch-Site`) and carry the form's CSRF
  token: an HMAC of the session (or, without a token, a secret of this process) that another site cannot read.
- A GET from another site is served only as a top-level navigation (a link followed): a page of another site
  can then neither read it nor, through `<img>` or `<script>`, learn whether a job exists.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, TypeAlias
from urllib.parse import quote

from aiohttp import hdrs, web

from jobcar.api_tokens import ANONYMOUS, CALLER, ApiToken, Role, Tokens, TokenTable, allows
from jobcar.browser_guard import cross_site_problem, host_problem

SESSION_COOKIE: Final = "jobcar_ui"
SESSION_SECONDS: Final = 12 * 3600
#: The form field every POST carries.
CSRF_FIELD: Final = "csrf"
#: Routes served without a session: the login form and the assets it needs.
OPEN_PATHS: Final = ("/ui/login", "/ui/static/")
#: The POSTs that are not actions on jobs: a read-only dashboard takes them too.
SESSION_PATHS: Final = ("/ui/login", "/ui/logout")
SECURITY_HEADERS: Final = {
    # No inline script or style anywhere: a payload that slipped through escaping still could not run.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Not no-referrer: with it, browsers send `Origin: null` on the dashboard's own form POSTs.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

Handler: TypeAlias = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Access:
    #: The tokens in force, read anew on each request (a reload replaces them).
    tokens: Tokens
    write: bool
    allowed_hosts: tuple[str, ...] = ()
    #: Signs the CSRF token when there is no api_token (one per process: a restart voids open forms).
    process_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    @property
    def table(self) -> TokenTable:
        return self.tokens.table

    def new_session(self, token: ApiToken) -> str:
        """A cookie value: the expiry (epoch seconds), its HMAC under the token, and the token's name."""
        expires = str(int(time.time()) + SESSION_SECONDS)
        return f"{expires}.{self._sign(token, 'session', f'{expires}.{token.name}')}.{token.name}"

    def session_token(self, value: str | None) -> ApiToken | None:
        """The token in force that signed a cookie value that has not expired, or None. Any text may come here (a
        sibling site can set a cookie for this host): it is checked as bytes, never parsed loosely."""
        expires, _, rest = (value or "").partition(".")
        signature, _, name = rest.partition(".")
        if not _EXPIRY.fullmatch(expires) or int(expires) < time.time():
            return None
        token = self.table.named(name)
        if token is None or not _same(signature, self._sign(token, "session", f"{expires}.{name}")):
            return None
        return token

    def request_token(self, request: web.Request) -> ApiToken | None:
        """The token a request comes with: its session's, or its bearer header's (scripts)."""
        return self.session_token(request.cookies.get(SESSION_COOKIE)) or self.table.bearer(
            request.headers.get(hdrs.AUTHORIZATION)
        )

    def may_act(self, request: web.Request) -> bool:
        """Whether the dashboard shows this request its buttons and takes its POSTs: `ui.write`, and an operate
        token (or no token in force: the open dashboard on loopback)."""
        if not self.write:
            return False
        if not self.table.enabled:
            return True
        token = self.request_token(request)
        return token is not None and allows(token.role, Role.OPERATE)

    def valid_csrf(self, request: web.Request, given: object) -> bool:
        return isinstance(given, str) and _same(given, self.csrf_token(request))

    def csrf_token(self, request: web.Request) -> str:
        """The token the forms of this session carry: under its token, or the process secret when open."""
        token = self.request_token(request)
        return self._sign(token, "csrf", request.cookies.get(SESSION_COOKIE, "") if token else "")

    def _sign(self, token: ApiToken | None, purpose: str, value: str) -> str:
        key = token.secret.encode("utf-8", "surrogatepass") if token is not None else self.process_secret
        return hmac.new(key, f"jobcar-ui:{purpose}:{value}".encode(), hashlib.sha256).hexdigest()


ACCESS: Final = web.AppKey("jobcar.ui.access", Access)
#: A session's expiry: epoch seconds, ASCII digits only.
_EXPIRY: Final = re.compile(r"[0-9]{1,12}")


def _same(given: str, expected: str) -> bool:
    """Constant time, on bytes: any text encodes (surrogatepass), never to the bytes of another character."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def login_cookie(response: web.StreamResponse, request: web.Request, value: str, max_age: int) -> None:
    response.set_cookie(
        SESSION_COOKIE, value, max_age=max_age, path="/ui", httponly=True, samesite="Strict", secure=request.secure
    )


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The rules of the module docstring, in order: Host, origin, session, read-only, CSRF; then the security
    headers."""
    access = request.app[ACCESS]
    host = request.headers.get(hdrs.HOST)
    problem = None if access.table.enabled else host_problem(host, access.allowed_hosts)
    if problem is not None:
        return _refused(421, problem)
    if not _followed_link(request):
        problem = cross_site_problem(request.headers.get(hdrs.ORIGIN), request.headers.get("Sec-Fetch-Site"), host)
        if problem is not None:
            return _refused(403, problem.replace("the jobcar API takes", "the dashboard takes"))
    token = access.request_token(request) if access.table.enabled else None
    if access.table.enabled and token is None and not request.path.startswith(OPEN_PATHS):
        if request.method == "GET" and not request.path.endswith(".json"):
            raise web.HTTPSeeOther(f"/ui/login?next={quote(request.path_qs, safe='')}")
        return _refused(401, "sign in first: the dashboard needs the API token")
    if token is not None and not allows(token.role, Role.READ) and not request.path.startswith(OPEN_PATHS):
        return _refused(403, f"token {token.name} has role {token.role.value}: the dashboard needs read or operate")
    request[CALLER] = token.name if token is not None else ANONYMOUS
    if request.method == "POST" and request.path not in SESSION_PATHS:
        if not access.write:
            return _refused(403, "this dashboard is read-only (ui: {write: false}): it takes no action")
        if token is not None and not allows(token.role, Role.OPERATE):
            return _refused(403, f"read-only: token {token.name} has role {token.role.value}; acting needs operate")
        form = await request.post()
        if not access.valid_csrf(request, form.get(CSRF_FIELD)):
            return _refused(403, "this form is out of date or was not sent by the dashboard: reload the page")
    try:
        response = await handler(request)
    except web.HTTPException as answer:  # aiohttp's own (no such route, wrong method, a redirect) go out too
        answer.headers.update(SECURITY_HEADERS)
        raise
    response.headers.update(SECURITY_HEADERS)
    return response


def _followed_link(request: web.Request) -> bool:
    """A GET the user's browser sent to show the page itself (a link followed, a bookmark)."""
    return (
        request.method == "GET"
        and request.headers.get("Sec-Fetch-Mode") == "navigate"
        and request.headers.get("Sec-Fetch-Dest") == "document"
    )


def _refused(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message + "\n", headers=SECURITY_HEADERS)
