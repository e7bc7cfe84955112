"""What went through the proxy, and the faults it is told to inject.

Every storage request is logged as a `Request` of one kind, so that a test can
count what an operation costs (`with gcs.counting() as log: ...; log.kinds()`)
and aim a fault at one kind of request (`gcs.fail(503, kind="upload")`). The
proxy process keeps the log and the fault rules (`Traffic`); the test process
reads them as `RequestLog`s through the proxy's control API.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import threading
import time
import urllib.parse
from collections.abc import Sequence

# The kinds of storage request. `auth` is a token request (none is expected while
# GOOGLE_AUTH_TOKEN_FOR_TESTING is set) and `refused` one the proxy would not pass
# on: a host or a path other than Google's storage API.
KINDS = ("metadata", "list", "upload", "download", "delete", "copy", "auth", "other", "refused")

DOWNLOAD_HOST = "storage.googleapis.com"  # where TensorFlow reads object contents


@dataclasses.dataclass(frozen=True)
class Request:
    """One request as the client sent it, and how it was answered."""

    method: str
    host: str  # as the client named it: www.googleapis.com, storage.googleapis.com, 127.0.0.1:PORT
    path: str  # the request target as sent (escaped, with the query)
    kind: str
    bucket: str
    object: str  # the object's name, unescaped; "" for a bucket or a listing
    status: int | None = None  # None: a fault closed the connection before an answer
    time: float = 0.0  # time.time() at the start
    seconds: float = 0.0  # from the request's first line to the end of the answer
    fault: bool = False  # answered, dropped or slowed by an injected fault
    body_bytes: int = 0  # the request body's length as received (an upload's data)

    def __str__(self) -> str:
        answer = "dropped" if self.status is None else self.status
        return (
            f"{self.method} {self.host}{urllib.parse.unquote(self.path)} -> {answer} ({self.kind})"
        )

    def matches(self, *, kind: str | None, method: str | None, path: str | None) -> bool:
        """None matches anything; `path` is a regex searched in the unescaped request target."""
        return (
            (kind is None or self.kind == kind)
            and (method is None or self.method == method.upper())
            and (path is None or re.search(path, urllib.parse.unquote(self.path)) is not None)
        )


def classify(method: str, host: str, target: str) -> tuple[str, str, str]:
    """(kind, bucket, object) of a request to the JSON API, the upload API or the download host."""
    split = urllib.parse.urlsplit(target)
    path, query = split.path, urllib.parse.parse_qs(split.query)
    if path.startswith("/oauth2/") or path == "/token":
        return "auth", "", ""
    for prefix in ("/upload/storage/v1/b/", "/download/storage/v1/b/", "/storage/v1/b/"):
        if path.startswith(prefix):
            bucket, _, rest = path[len(prefix) :].partition("/")
            break
    else:
        if host == DOWNLOAD_HOST and path.count("/") >= 2:  # /<bucket>/<object>
            bucket, _, escaped = path[1:].partition("/")
            return "download", bucket, urllib.parse.unquote(escaped)
        return "other", "", ""

    if prefix.startswith("/upload/"):
        return "upload", bucket, query.get("name", [""])[0]
    if rest == "o" and method == "GET":
        return "list", bucket, ""
    if rest.startswith("o/"):
        # Object names are escaped whole (a/b is a%2Fb), so the next "/" starts an action.
        escaped, _, action = rest[2:].partition("/")
        name = urllib.parse.unquote(escaped)
        if prefix.startswith("/download/") or query.get("alt") == ["media"]:
            return "download", bucket, name
        if action.startswith(("rewriteTo/", "copyTo/")) or action == "compose":
            return "copy", bucket, name
        if method == "DELETE":
            return "delete", bucket, name
        if method == "GET":
            return "metadata", bucket, name
        return "other", bucket, name
    if rest in ("", "storageLayout") and method == "GET":
        return "metadata", bucket, ""
    return "other", bucket, ""


class RequestLog(Sequence[Request]):
    """A run of logged requests, with counts by kind."""

    def __init__(self, requests: Sequence[Request] = ()):
        self._requests = list(requests)

    def __getitem__(self, index):
        return self._requests[index]

    def __len__(self) -> int:
        return len(self._requests)

    def kinds(self) -> collections.Counter[str]:
        """How many requests of each kind, e.g. Counter({'metadata': 4, 'upload': 2})."""
        return collections.Counter(r.kind for r in self._requests)

    def count(
        self, kind: str | None = None, method: str | None = None, path: str | None = None
    ) -> int:
        """How many requests match (see Request.matches)."""
        return sum(r.matches(kind=kind, method=method, path=path) for r in self._requests)

    def body_bytes(
        self, kind: str | None = None, method: str | None = None, path: str | None = None
    ) -> int:
        """The request bodies' bytes of the requests that match (see Request.matches)."""
        return sum(
            r.body_bytes for r in self._requests if r.matches(kind=kind, method=method, path=path)
        )

    def objects(self, kind: str) -> list[str]:
        """The objects that requests of `kind` named, in order (with repeats)."""
        return [r.object for r in self._requests if r.kind == kind]

    def summary(self) -> str:
        """One line: '9 requests: 3 metadata, 2 upload, ...', the kinds in KINDS order."""
        kinds = self.kinds()
        parts = [f"{kinds[k]} {k}" for k in KINDS if kinds[k]]
        return f"{len(self)} requests" + (": " + ", ".join(parts) if parts else "")

    def __str__(self) -> str:
        return "\n".join([self.summary(), *(f"  {r}" for r in self._requests)])

    __repr__ = __str__  # what pytest shows of a log in a failed assertion


@dataclasses.dataclass
class FaultRule:
    """What to do to the requests that match `kind`, `method` and `path` (None: any).

    It acts on the `nth` matching request (1: the first) and the `times - 1` after
    it (times=None: on every one from the nth on), or, given `seconds`, on every
    matching request for that long from its making. Acting is: answer `status`
    without passing the request on, or read `drop_after` bytes of its body and
    close the connection, or only wait `delay` seconds before answering (with a
    status or a drop, the wait comes first).
    """

    kind: str | None = None
    method: str | None = None
    path: str | None = None
    nth: int = 1
    times: int | None = 1
    seconds: float | None = None
    status: int | None = None
    drop_after: int | None = None
    delay: float = 0.0
    seen: int = dataclasses.field(default=0, init=False, repr=False)  # matching requests so far
    hits: int = dataclasses.field(default=0, init=False, repr=False)  # the requests it acted on
    made: float = dataclasses.field(default_factory=time.monotonic, init=False, repr=False)

    def take(self, request: Request) -> bool:
        """Counts `request` if it matches; True if the rule acts on it."""
        if not request.matches(kind=self.kind, method=self.method, path=self.path):
            return False
        self.seen += 1
        if self.seconds is not None:
            acts = time.monotonic() < self.made + self.seconds
        else:
            last = None if self.times is None else self.nth + self.times - 1
            acts = self.seen >= self.nth and (last is None or self.seen <= last)
        self.hits += acts
        return acts


class Traffic:
    """The request log and the fault rules, shared by the proxy's connection threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        self._rules: dict[int, FaultRule] = {}
        self._next_rule = 1

    def add_rule(self, rule: FaultRule) -> int:
        with self._lock:
            rule_id, self._next_rule = self._next_rule, self._next_rule + 1
            self._rules[rule_id] = rule
        return rule_id

    def rule(self, rule_id: int) -> FaultRule | None:
        with self._lock:
            return self._rules.get(rule_id)

    def clear_rules(self) -> None:
        with self._lock:
            self._rules.clear()

    def rule_for(self, request: Request) -> FaultRule | None:
        """The first rule that acts on `request` (every matching rule counts it)."""
        with self._lock:
            acting = [rule for rule in self._rules.values() if rule.take(request)]
        return acting[0] if acting else None

    def record(self, request: Request) -> None:
        with self._lock:
            self._requests.append(request)

    def since(self, index: int) -> list[Request]:
        """The requests logged from the `index`-th on."""
        with self._lock:
            return self._requests[index:]

    def total(self) -> int:
        with self._lock:
            return len(self._requests)
