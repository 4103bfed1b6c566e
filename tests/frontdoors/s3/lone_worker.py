"""A non-chief process without a process group (``is_chief=False`` alone) on ``s3://`` logdirs,
its client configured by ``storage_options=`` only: ``python lone_worker.py EMPTY_URL URL OPTIONS_JSON``.

1. waits on ``EMPTY_URL`` until SIGTERM ends the wait (prints ``STOPPED: <message>``);
2. waits on ``URL`` for the chief's first checkpoint and restores it (prints ``RESULT <json>``)."""
from __future__ import annotations

import json
import logging
import sys

from supervisor import Supervisor
from supervisor.errors import StopRequestedError
from tests.frontdoors.s3.models import build, digest


def _worker(url: str, options: dict) -> tuple[Supervisor, tuple]:
    model, optimizer = build(seed=1)  # unlike the chief's: only a restore makes them equal
    sv = Supervisor(url, model=model, optimizer=optimizer, is_chief=False, storage_options=options,
                    save_model_secs=0, save_summaries_secs=0, recovery_wait_secs=0.2, max_wait_secs=120)
    return sv, (model, optimizer)


def main(empty_url: str, url: str, options_json: str) -> None:
    options = json.loads(options_json)
    try:
        with _worker(empty_url, options)[0].managed_session():
            print("UNEXPECTED: restored from", empty_url, flush=True)
    except StopRequestedError as e:
        print("STOPPED:", e, flush=True)
    sv, state = _worker(url, options)
    with sv.managed_session() as s:
        print("RESULT " + json.dumps({"step": s.global_step, "digest": digest(*state)}), flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")
    main(*sys.argv[1:])
