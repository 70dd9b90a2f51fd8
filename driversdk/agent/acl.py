"""ACL tokens of the agent, as Nomad bootstraps them: ``POST /v1/acl/bootstrap`` makes the one
management token once and returns its secret that one time; every later request over TCP must
carry it (``X-Nomad-Token``, or ``Authorization: Bearer``). Only a SHA-256 of each secret is kept
in ``state.db``, and secrets are compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from dataclasses import dataclass
from typing import Any

from driversdk.agent.state.store import Table
from driversdk.errors import DriverSDKError, StateWriteError

MANAGEMENT = "management"


class BootstrapDone(DriverSDKError):
    """The management token exists already."""


@dataclass(frozen=True)
class Token:
    accessor: str
    secret: str  # only known right after bootstrap
    name: str
    type: str
    create_time: int

    def to_api(self, index: int) -> dict[str, Any]:
        return {
            "AccessorID": self.accessor,
            "SecretID": self.secret,
            "Name": self.name,
            "Type": self.type,
            "Policies": None,
            "Roles": None,
            "Global": True,
            "CreateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.create_time / 1e9)),
            "ExpirationTime": None,
            "CreateIndex": index,
            "ModifyIndex": index,
        }


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenStore(Table):
    """The ACL tokens table on a :class:`Store`, or on the store of a data dir."""

    def bootstrap(self) -> Token:
        token = Token(str(uuid.uuid4()), str(uuid.uuid4()), "Bootstrap Token", MANAGEMENT, time.time_ns())
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    if self._db.execute("SELECT 1 FROM agent_acl WHERE type=?", (MANAGEMENT,)).fetchone():
                        raise BootstrapDone("ACL bootstrap already done")
                    self._db.execute(
                        "INSERT INTO agent_acl VALUES (?, ?, ?, ?, ?)",
                        (token.accessor, _digest(token.secret), token.name, token.type, token.create_time),
                    )
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
        except StateWriteError as err:
            raise err.about("the bootstrap token") from None
        return token

    def valid(self, secret: str) -> bool:
        if not secret:
            return False
        digest = _digest(secret)
        with self._lock:
            rows = self._db.execute("SELECT secret_sha256 FROM agent_acl").fetchall()
        return any(hmac.compare_digest(digest, r[0]) for r in rows)
