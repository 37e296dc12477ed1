"""The operations the tracking service does for a command besides its runs, each named once: an operation of the
protocol (xp.tracking.messages) to the function that does it (`OPS`). A command asks for one with `call`: the
service does it, or, where no service serves the store, the command's process does the same function itself.
And the service's process: `python -m xp.trackingd SOCKET PIDFILE IDENTITY` (xp.tracking.service starts it), whose
serving is xp.tracking.daemon's."""

from __future__ import annotations

import sys
from typing import Any, Callable

from xp.readback.work import best_model, study_result, sweep_result
from xp.tracking import service
from xp.tracking.ending import end_lost
from xp.tracking.leftovers import deliver_left
from xp.tracking.messages import BestModel, DeliverLeft, EndLost, Op, StudyResult, SweepResult

OPS: dict[type[Op], Callable[..., Any]] = {EndLost: end_lost, DeliverLeft: deliver_left, SweepResult: sweep_result,
                                           StudyResult: study_result, BestModel: best_model}


def call(op: Op) -> Any:
    """The command's MLflow work `op`, by the service where it serves the store, else here (service.call)."""
    return service.call(op, OPS[type(op)])


if __name__ == "__main__":
    from xp.tracking import daemon

    sys.exit(daemon.main(sys.argv[1:], OPS))
