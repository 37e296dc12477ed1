"""Hydra sweeper that runs an Optuna study: installed as hydra_plugins.xp_optuna_sweeper.

Hydra instantiates sweepers only from the hydra_plugins namespace; xp's CLI registers
this class with Hydra and selects it (hydra/sweeper=xp_optuna) for `-m sweep=NAME`.
The work is in xp.studies.sweeper; its trials run where the command's placement (xp.launching.placement) says.
"""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper


class XPOptunaSweeper(Sweeper):
    def __init__(self, **options: Any):
        self.options = options

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        from xp.launching.hydra_launchers import at_once
        from xp.launching.placement import Placement
        from xp.studies.sweeper import run_study

        return run_study(self.config, arguments, self.launcher, Placement.current(),
                         at_once(self.config.hydra.launcher))
