"""The trainer ranks' rendezvous store keeps every key under a prefix derived from the job's secret: a client
of the same TCPStore without the secret finds none of the names the ranks use."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from rlctl.agents.trainer import store_prefix
from tests.conftest import ROOT

RANK = textwrap.dedent(
    """
    import datetime, json, sys
    import torch.distributed as dist
    from rlctl.agents.trainer import init_group, store_prefix
    from rlctl.ops.runstart import _free_port

    # below the ephemeral range, as a launch picks it: a port bound at 0, closed, then bound again by the store
    # could be taken meanwhile by another process's outgoing connection ("Address already in use")
    port = _free_port()
    secret = bytes.fromhex(sys.argv[1])
    init_group(rank=0, world_size=1, master_addr="127.0.0.1", master_port=port, secret=secret)
    # the default group's store wraps the one init_group made: a key set there, as the ranks set theirs
    made = dist.distributed_c10d._get_default_store().underlying_store
    made.set("probe", "here")
    outsider = dist.TCPStore("127.0.0.1", port, 1, False, timeout=datetime.timedelta(seconds=10))
    p = store_prefix(secret)
    print(json.dumps({"bare": outsider.check(["probe"]), "prefixed": outsider.check([p + "/probe"])}))
    dist.destroy_process_group()
    """
)


def test_the_ranks_keys_are_under_the_jobs_secret_prefix() -> None:
    secret = b"\x07" * 32
    out = subprocess.run(
        [sys.executable, "-c", RANK, secret.hex()], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"bare": False, "prefixed": True}
    assert store_prefix(secret) != store_prefix(b"\x08" * 32) and secret.hex() not in store_prefix(secret)
