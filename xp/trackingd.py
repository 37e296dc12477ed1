"""The tracking service's process: `python -m xp.trackingd SOCKET PIDFILE IDENTITY` (xp.tracking.service starts
it). Its serving is xp.tracking.daemon's; what it does for a command, besides runs, is named here, an operation
of the protocol (xp.tracking.messages) to a function each: the command's process does the same function itself
where no service serves its store (service.call)."""

from __future__ import annotations

import sys
from typing import Any, Callable

from xp.readback.work import best_model, study_result, sweep_result
from xp.tracking import daemon
from xp.tracking.ending import end_lost
from xp.tracking.leftovers import deliver_left
from xp.tracking.messages import BestModel, DeliverLeft, EndLost, Op, StudyResult, SweepResult

OPS: dict[type[Op], Callable[..., Any]] = {EndLost: end_lost, DeliverLeft: deliver_left, SweepResult: sweep_result,
                                           StudyResult: study_result, BestModel: best_model}

if __name__ == "__main__":
    sys.exit(daemon.main(sys.argv[1:], OPS))
