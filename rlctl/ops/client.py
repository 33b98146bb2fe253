"""A client connection to a job's controller (`connect_client`: status, scale, stop requests), and the address
it connects to, from the job's controller.json (`controller_address`)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from rlctl.errors import LaunchError
from rlctl.launch.jobdir import JobDir
from rlctl.transport import Connection, Message, make_transport

log = logging.getLogger(__name__)


def connect_client(jobdir: JobDir, *, timeout_s: float, name: str) -> Connection:
    """A client connection to the job's controller (status, scale, stop requests); LaunchError naming
    controller.json when it holds no address to connect to."""
    job = jobdir.read_job()
    address = controller_address(jobdir)
    transport = make_transport(job.transport.kind, secret=jobdir.secret(), encrypt=job.transport.encrypt)
    try:
        conn = transport.connect(address, timeout_s=timeout_s)
    except ValueError as e:  # not an address of the job's transport
        raise LaunchError(f"{jobdir.controller_json}: address: {e}") from e
    conn.send(Message("hello", client_hello(name)))
    return conn


def controller_address(jobdir: JobDir) -> str:
    """The address in the job's controller.json (OSError when there is none; LaunchError naming the file when it
    is not {"address": "SCHEME://HOST:PORT", …})."""
    data = jobdir.read_json(jobdir.controller_json)
    address = data.get("address") if isinstance(data, dict) else None
    if not isinstance(address, str):
        raise LaunchError(
            f'{jobdir.controller_json}: no controller address (want {{"address": "tcp://HOST:PORT", …}}, '
            f"got {json.dumps(data)[:80]})"
        )
    return address


def client_hello(name: str) -> dict[str, Any]:
    """The header of a client's `hello` (the client fields of `rlctl.agents.messages.Hello`)."""
    return {"role": "client", "name": name, "pid": os.getpid()}
