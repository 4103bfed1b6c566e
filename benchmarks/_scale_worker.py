"""One rank of benchmarks/scale.py: ``python benchmarks/_scale_worker.py MODE ARGS...``.

Self-contained on purpose (no ``benchmarks`` import, only the runtime's public names): the same
file runs against this checkout and against a checkout of today's design (``PYTHONPATH`` picks
which ``supervisor`` is imported), so both are measured by the same code in the same run.

Modes (every rank prints one ``RESULT <json>`` line):

- ``traffic STEPS STEP_SECS GRACE``: ``CollectiveAgreement.decide`` once per step of
  ``STEP_SECS`` (a sleep: the step's compute), no DDP model (the FSDP2 / DTensor / eval case, where
  the agreement has a collective of its own). Counts the runtime's store requests through a
  counting store under its ``PrefixStore`` (every request of the agreement, its liveness and its
  diagnosis goes through ``supervisor.distributed.env.default_store()``), the collectives started,
  and the size of the agreement's message.
- ``blame KIND VICTIM GRACE``: rank ``VICTIM`` fails at step 5 (``kill``: SIGKILL, ``stop``:
  SIGSTOP, ``raise``: an exception, after closing its agreement with it, as a session does); each
  other rank reports the ranks its `RankFailureError` names (or the watchdog's exit line names).
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from typing import Any

import torch.distributed as dist


class CountingStore(dist.Store):
    """A c10d store that forwards to ``inner`` and counts each request by kind."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.counts: dict[str, int] = {}

    def _count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def set(self, key, value):  # noqa: ANN001, D102
        self._count("set")
        return self.inner.set(key, value)

    def get(self, key):  # noqa: ANN001, D102
        self._count("get")
        return self.inner.get(key)

    def check(self, keys):  # noqa: ANN001, D102
        self._count("check")
        return self.inner.check(keys)

    def add(self, key, value):  # noqa: ANN001, D102
        self._count("add")
        return self.inner.add(key, value)

    def append(self, key, value):  # noqa: ANN001, D102
        self._count("append")
        return self.inner.append(key, value)

    def compare_set(self, key, expected, desired):  # noqa: ANN001, D102
        self._count("compare_set")
        return self.inner.compare_set(key, expected, desired)

    def multi_get(self, keys):  # noqa: ANN001, D102
        self._count("multi_get")
        return self.inner.multi_get(keys)

    def multi_set(self, keys, values):  # noqa: ANN001, D102
        self._count("multi_set")
        return self.inner.multi_set(keys, values)

    def wait(self, keys, *args):  # noqa: ANN001, D102
        self._count("wait")
        return self.inner.wait(keys, *args)

    def delete_key(self, key):  # noqa: ANN001, D102
        self._count("delete_key")
        return self.inner.delete_key(key)

    def num_keys(self):  # noqa: D102
        self._count("num_keys")
        return self.inner.num_keys()

    def has_extended_api(self):  # noqa: D102
        return True

    def clone(self):  # noqa: D102 - a second connection (the diagnosis responder's), counted with this one
        copy = CountingStore(self.inner.clone())
        copy.counts = self.counts
        self.__dict__.setdefault("_clones", []).append(copy)  # the C++ side does not keep the Python object
        return copy

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def emit(value: Any) -> None:
    print("RESULT " + json.dumps(value), flush=True)


def _message_bytes(agreement: Any) -> int:
    """The size of one agreement message (the flags tensor sent each step)."""
    buffers = getattr(agreement, "_buffers", None)
    if not buffers:
        return -1
    return buffers[0].numel() * buffers[0].element_size()


def traffic(steps: str, step_secs: str, grace: str) -> None:
    from supervisor.distributed import env
    from supervisor.distributed.agreement import CollectiveAgreement
    from supervisor.agreement import NO_REQUESTS

    counting = CountingStore(env.default_store())
    env.default_store = lambda: counting  # the runtime's store, counted
    agreement = CollectiveAgreement(stop_grace_secs=float(grace))
    agreement.decide(0, NO_REQUESTS)  # the first boundary: side group, watchdog
    dist.barrier()
    before, started = counting.total, time.monotonic()
    for step in range(1, int(steps) + 1):
        time.sleep(float(step_secs))
        agreement.decide(step, NO_REQUESTS)
    steady = counting.total - before
    elapsed = time.monotonic() - started
    agreement.close()
    emit({"rank": dist.get_rank(), "steps": int(steps), "steady_requests": steady,
          "total_requests": counting.total, "counts": counting.counts, "collectives": agreement.collectives,
          "message_bytes": _message_bytes(agreement), "secs": elapsed})


def blame(kind: str, victim: str, grace: str) -> None:
    from supervisor.distributed.agreement import CollectiveAgreement
    from supervisor.distributed.failure import RankFailureError
    from supervisor.agreement import NO_REQUESTS

    rank = dist.get_rank()
    agreement = CollectiveAgreement(stop_grace_secs=float(grace))
    started = time.monotonic()
    try:
        for step in range(1, 100_000):
            if rank == int(victim) and step == 5:
                _fail(kind, agreement)
            agreement.decide(step, NO_REQUESTS)
            time.sleep(0.02)
    except RankFailureError as e:
        emit({"rank": rank, "named": list(e.ranks), "secondary": list(getattr(e, "secondary", ()) or ()),
              "secs": time.monotonic() - started, "error": str(e)[:600]})
        os._exit(0)
    except Exception as e:  # noqa: BLE001 - anything else names nobody
        emit({"rank": rank, "named": [], "secs": time.monotonic() - started, "error": f"{type(e).__name__}: {e}"[:600]})
        os._exit(0)


def _fail(kind: str, agreement: Any) -> None:
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    error = ValueError(f"boom on rank {dist.get_rank()}")
    agreement.close(error)
    print(f"raising {error}", flush=True)
    os._exit(1)


#: How a watchdog's exit line names the rank it gave up on.
WATCHDOG_NAMES = re.compile(r"RankFailureError: rank (\d+) (?:stopped responding|hung|failed)")


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    from supervisor import distributed

    distributed.init_process_group("gloo", timeout_secs=60)
    {"traffic": traffic, "blame": blame}[mode](*args)
    distributed.destroy_process_group(timeout_secs=30)


if __name__ == "__main__":
    main()
