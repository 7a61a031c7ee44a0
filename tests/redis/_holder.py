"""A lease holder process for the fault tests.

Usage: ``python _holder.py '<json>'`` with ``redis_url``, ``ledger_url``, ``org``,
``principal``, ``resource`` and ``mode``: ``hold`` (hold the lease in a lease block until
killed) or ``fenced`` (write fenced checkpoints every 0.1 s until one is refused, then try a
renew and leave the block). Prints the lease as the first JSON line, then (``fenced``) one
JSON line with what happened.
"""

from __future__ import annotations

import json
import sys
import time

from prefect_baton import Baton, BatonError, LeaseLostError

TTL = 10


def main() -> None:
    cfg = json.loads(sys.argv[1])
    b = Baton(
        ledger_url=cfg["ledger_url"],
        org=cfg["org"],
        principal=cfg["principal"],
        redis_url=cfg["redis_url"],
        ack="ledger",
    )
    result: dict[str, object] = {}
    try:
        with b.lease("res", cfg["resource"], ttl_seconds=TTL) as held:
            print(json.dumps(held.lease.model_dump(mode="json")), flush=True)
            if cfg["mode"] == "hold":
                while True:
                    time.sleep(1)
            while True:
                try:
                    b.checkpoints.save("subject", "progress", {"t": time.time()}, fence=held)
                except BatonError as exc:
                    result["fenced_save"] = exc.code
                    break
                time.sleep(0.1)
            result["lease"] = held.lease.model_dump(mode="json")
            try:
                b.leases.renew(held.lease)
                result["renew"] = "OK"
            except BatonError as exc:
                result["renew"] = exc.code
    except LeaseLostError as exc:
        result["exit"] = exc.code
    else:
        result["exit"] = "OK"
    print(json.dumps(result), flush=True)
    b.close()


if __name__ == "__main__":
    main()
