"""A simulated CRM: a real loopback HTTP server that can fail, slow down or lose responses."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import SplitResult, parse_qs, unquote

from fakes import _http
from fakes._http import MAX_BODY_BYTES, MODES, HttpError, Reply

__all__ = ["DEFAULT_CUSTOMERS", "MAX_BODY_BYTES", "MAX_KEY_CHARS", "MODES", "FakeCrm", "main"]

MAX_KEY_CHARS: Final = 255
DEFAULT_CUSTOMERS: Final = {"ACME-42": "Acme Corporation"}
_NOTES_PATH: Final = re.compile(r"/v1/customers/([^/]+)/notes")
_CUSTOMER_PATH: Final = re.compile(r"/v1/customers/([^/]+)")
_CUSTOMER_ID: Final = re.compile(r"[^/\s]{1,255}")


class _State(_http.State):
    """Customers, notes and the fault mode; every method holds the lock for its whole body."""

    def __init__(self, customers: dict[str, str]) -> None:
        self._seed = customers
        super().__init__()

    def _clear(self) -> None:
        self.names = dict(self._seed)
        self.revisions = dict.fromkeys(self._seed, 1)
        self.notes: list[dict[str, Any]] = []
        self.replies: dict[str, dict[str, Any]] = {}  # idempotency key -> first 201 body
        # False makes a deliberately broken connector: a repeated key acts again (what the
        # conformance kit must catch).
        self.honour_keys = True

    def create_note(self, customer_id: str, key: str, body: str, if_match: str | None) -> Reply:
        with self.lock:
            # The key goes before If-Match: retrying a note whose response was lost must replay
            # it, although the revision has moved on since.
            if self.honour_keys and (done := self.replies.get(key)) is not None:
                if (done["customer_id"], done["body"]) != (customer_id, body):
                    raise HttpError(409, "idempotency key reused with a different request")
                return Reply(200, done, {"Idempotent-Replayed": "true"})
            if customer_id not in self.revisions:
                raise HttpError(404, "customer not found")
            current = f"r{self.revisions[customer_id]}"
            if if_match is not None and if_match != current:
                raise HttpError(412, "revision mismatch", revision=current)
            self.revisions[customer_id] += 1
            note = {
                "note_id": f"note_{len(self.notes) + 1}",
                "customer_id": customer_id,
                "body": body,
                "idempotency_key": key,
                "created_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            }
            self.notes.append(note)
            self.replies[key] = {**note, "revision": f"r{self.revisions[customer_id]}"}
            return Reply(201, self.replies[key])

    def customer(self, customer_id: str) -> dict[str, str]:
        with self.lock:
            if customer_id not in self.revisions:
                raise HttpError(404, "customer not found")
            revision = f"r{self.revisions[customer_id]}"
            return {
                "customer_id": customer_id,
                "name": self.names[customer_id],
                "revision": revision,
            }


class FakeCrm(_http.LoopbackFake):
    """The CRM that Writ's connectors call, served over HTTP on loopback."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str,
        customers: dict[str, str] | None = None,
    ) -> None:
        if not token:
            raise ValueError("token must not be empty")
        state = _State(dict(DEFAULT_CUSTOMERS if customers is None else customers))
        # Bind now so `url` is known before start(), e.g. to hand to a subprocess.
        super().__init__(_http.Server((host, port), _Handler, token=token.encode(), state=state))


class _Handler(_http.Handler):
    server: _http.Server[_State]

    def _route_api(self, method: str, url: SplitResult) -> Reply | None:
        state, path = self.server.state, url.path
        notes = _NOTES_PATH.fullmatch(path) if method == "POST" else None
        if notes:
            state.count_call()  # every note POST counts, including those refused below
        self._authorize()
        if notes:
            return self._post_note(unquote(notes[1]))
        if method == "GET" and (customer := _CUSTOMER_PATH.fullmatch(path)):
            return Reply(200, state.customer(unquote(customer[1])))
        if (method, path) == ("GET", "/v1/notes"):
            if not (keys := parse_qs(url.query).get("idempotency_key")):
                raise HttpError(400, "idempotency_key query parameter required")
            with state.lock:
                return Reply(
                    200, {"notes": [n for n in state.notes if n["idempotency_key"] == keys[0]]}
                )
        raise HttpError(404, "not found")

    def _post_note(self, customer_id: str) -> Reply | None:
        req = self._json()
        if not isinstance(req, dict) or not isinstance(body := req.get("body"), str):
            raise HttpError(400, "body must be a string")
        if not (key := self.headers.get("Idempotency-Key")):
            raise HttpError(400, "idempotency key required")
        if len(key) > MAX_KEY_CHARS:
            raise HttpError(400, f"idempotency key longer than {MAX_KEY_CHARS} chars")
        self._check_receipt(key)
        return self._under_mode(
            lambda: self.server.state.create_note(
                customer_id, key, body, self.headers.get("If-Match")
            ),
            key,
        )

    def _route_control(self, method: str, path: str) -> Reply:
        state = self.server.state
        if (method, path) == ("GET", "/_control/notes"):
            with state.lock:
                return Reply(200, list(state.notes))
        if (method, path) == ("POST", "/_control/idempotency"):
            req = self._json()
            if not isinstance(req, dict) or set(req) != {"honour"}:
                raise HttpError(400, 'expected exactly {"honour": true|false}')
            if not isinstance(honour := req["honour"], bool):
                raise HttpError(400, "honour must be true or false")
            with state.lock:
                state.honour_keys = honour
            return Reply(200, {"honour": honour})
        if (method, path) == ("POST", "/_control/customers"):
            req = self._json()
            cid, name = (
                (req.get("customer_id"), req.get("name")) if isinstance(req, dict) else (0, 0)
            )
            if not isinstance(cid, str) or not _CUSTOMER_ID.fullmatch(cid):
                raise HttpError(400, "customer_id must be 1..255 chars without '/' or spaces")
            if not isinstance(name, str):
                raise HttpError(400, "name must be a string")
            with state.lock:
                state.names[cid], state.revisions[cid] = name, 1
            return Reply(201, {"customer_id": cid, "name": name, "revision": "r1"})
        raise HttpError(404, "not found")


def main(argv: list[str] | None = None) -> None:
    """Serve the fake CRM until SIGTERM or SIGINT."""
    parser = _http.arg_parser("python -m fakes.crm", main.__doc__)
    _http.serve(
        parser, argv, lambda args, token: FakeCrm(host=args.host, port=args.port, token=token)
    )


if __name__ == "__main__":
    main()
