"""One rank of test_wire.py: `wire_rank.py RANK WORLD RENDEZVOUS OUT` — broadcasts and gathers values through
`rlctl.trainers.wire` over a gloo group, and writes what it received (JSON) to OUT."""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch.distributed as dist

from rlctl.errors import ProtocolError
from rlctl.rl.learner import Chunk, Command, Step, Stop
from rlctl.rl.samples import Sample
from rlctl.trainers.wire import all_gather_values, broadcast_value
from tests.unit.rank_end import end_rank


def main() -> None:
    rank, world, rendezvous, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))  # fmt: skip
    sample = Sample("p0", [1, 2], [3, 4, 5], [-0.5, -1.25, -2.0], 0.75, version=3)
    got: dict[str, object] = {}
    cmd = broadcast_value(Chunk([sample], [0.1]) if rank == 0 else None, Command)  # type: ignore[arg-type]
    assert isinstance(cmd, Chunk)
    got["chunk"] = [cmd.samples[0].__dict__, cmd.advantages]
    got["step"] = broadcast_value(Step(41, 41.0) if rank == 0 else None, Command).tokens  # type: ignore[arg-type, union-attr]
    got["stop"] = type(broadcast_value(Stop() if rank == 0 else None, Command)).__name__  # type: ignore[arg-type]
    got["gathered"] = all_gather_values(f"tcp://10.0.0.{rank}:1" * (rank + 1), str)
    got["bytes"] = [len(b) for b in all_gather_values(bytes(range(rank * 100 % 256)) * (rank + 1), bytes)]
    try:  # rank 0 sends a value of the wrong shape: every rank refuses it, nothing is built from it
        broadcast_value({"os.system": "echo pwned"} if rank == 0 else None, Command)  # type: ignore[arg-type]
        got["wrong"] = "accepted"
    except ProtocolError as e:
        got["wrong"] = str(e)
    with open(out, "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    end_rank()  # not through finalization (tests/unit/rank_end.py)
