"""A node's own identity (issue 14, ``gpusched_common.node_keys``): the key it signs every report and
telemetry sample with, kept in ``<agent dir>/<node>/node.key`` (mode 0600), and its enrolment.

A node that has no key makes one; until placement confirmed its enrolment (``NodeEnrolled``, remembered in
``node.enrolled``) it sends ``NodeEnrolmentRequested``, vouched for by the operator's join token, before
anything else at each start: the request and the node's first reports share a partition, so placement has
enrolled the key before it reads them. Once enrolled the node needs no token again. Without a key and a
token the agent does not start, unless ``GPUSCHED_AGENT_UNENROLLED=true`` (development: its reports go
unsigned and only a placement that accepts unsigned reports believes them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from gpusched_common import events as ev
from gpusched_common import node_keys
from gpusched_common.files import write_private
from gpusched_common.producers import ProducerKey
from gpusched_common.signing import Signer, ensure_key_file

log = logging.getLogger(__name__)
KEY_FILE = "node.key"
ENROLLED_FILE = "node.enrolled"
# after a refusal the request goes again, freshly signed, after this long, doubling to the most: a refusal
# may pass (placement read the request too late, beyond the signature's window, because it was far behind;
# an operator revoked the node's old key), and a node that gave up would stay out until restarted
ENROL_RETRY_FIRST_S, ENROL_RETRY_MAX_S = 30.0, 600.0


@dataclass
class NodeIdentity:
    node_id: str
    key: ProducerKey | None  # None: unenrolled development node, its reports go unsigned
    directory: Path
    request: ev.NodeEnrolmentRequested | None = None  # what to send at start (None: enrolled already)
    refused: str | None = None  # why placement refused the enrolment, if it did
    retry_at: float | None = None  # when to ask again after a refusal (the agent's monotonic clock)
    retry_s: float = ENROL_RETRY_FIRST_S

    @property
    def signer(self) -> Signer | None:
        return Signer(self.key) if self.key is not None else None

    @property
    def enrolled(self) -> bool:
        return self.key is not None and self.request is None

    def on_answer(self, answer: ev.NodeEnrolled | ev.NodeEnrolmentRefused, now: float = 0.0) -> None:
        """Placement's answer to this node's enrolment (one for another key is an old answer: ignored); a
        refusal schedules the request again (``ask_again``) at ``now`` + the current back-off."""
        if self.key is None or answer.node_id != self.node_id or answer.key_id != self.key.producer_id:
            return
        if isinstance(answer, ev.NodeEnrolled):
            if self.request is not None:
                write_private(self.directory / ENROLLED_FILE, self.key.producer_id + "\n")
                log.info("%s: enrolled with key %s; its reports are believed", self.node_id, self.key.producer_id)
            self.request, self.refused, self.retry_at = None, None, None
        elif self.request is not None:
            self.refused = answer.reason
            if self.retry_at is None:
                self.retry_at = now + self.retry_s
            log.error("%s: placement refused to enrol key %s: %s. Its reports are refused until it is enrolled; "
                      "asking again in %.0f s.", self.node_id, self.key.producer_id, answer.reason, self.retry_at - now)

    def ask_again(self, now: float) -> bool:
        """Whether the refused request is due again now (then the next one waits twice as long)."""
        if self.request is None or self.retry_at is None or now < self.retry_at:
            return False
        self.retry_s = min(ENROL_RETRY_MAX_S, self.retry_s * 2)
        self.retry_at = None  # set again by the next refusal
        return True


def load_identity(directory: Path, node_id: str, token_text: str | None, unenrolled: bool) -> NodeIdentity:
    """The node's identity from its directory (a key made where there is none); ValueError saying what is
    missing where the node is not enrolled and has no join token (and is no development node)."""
    key_path, marker = directory / KEY_FILE, directory / ENROLLED_FILE
    token = node_keys.parse_token(token_text) if token_text else None
    if token_text and token is None:
        raise ValueError(f"{node_id}: the join token is not a gjt_<id>_<secret> token (see `gpusched join-token "
                         "create`)")
    try:
        enrolled_as = marker.read_text().strip() if marker.exists() else None
    except OSError:
        enrolled_as = None
    if token is None and (not key_path.exists() or enrolled_as is None):
        if unenrolled:
            return NodeIdentity(node_id, None, directory)
        raise ValueError(f"{node_id} is not enrolled and has no join token: give it one (GPUSCHED_AGENT_JOIN_TOKEN or "
                         "GPUSCHED_AGENT_JOIN_TOKEN_FILE, from `gpusched join-token create`); "
                         "GPUSCHED_AGENT_UNENROLLED=true only for development")
    directory.mkdir(parents=True, exist_ok=True)
    key = ensure_key_file(key_path)
    if enrolled_as == key.producer_id:
        return NodeIdentity(node_id, key, directory)
    assert token is not None
    request = node_keys.enrolment_request(token, node_id, key.producer_id, key.public_key_text())
    return NodeIdentity(node_id, key, directory, request)
