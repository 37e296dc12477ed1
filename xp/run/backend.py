"""The interface every training backend implements.

The core owns the epoch loop, the schedule of events, tracking and telemetry;
a backend only does what differs between engines: how one epoch of steps runs
(gradient aggregation, parameter update) and how the model is evaluated.

Plugins register a subclass under the entry-point group `xp.backends`:

    [project.entry-points."xp.backends"]
    mybackend = "my_package.module:MyBackend"

Keep the plugin module's top level free of heavy imports (the framework,
mlflow): import them inside the methods, so a broken or absent framework only
fails when this backend is selected.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable

if TYPE_CHECKING:
    from xp.run.plan import ModelSpec, Plan
    from xp.run.pretrained import PretrainedRequest, PretrainedSpec

# on_batch(step_in_epoch, samples): the core's loop calls it once per step, after the step was given (the step
# before it has been read back, so batch times are within a step of the work done).
BatchHook = Callable[[int, int], None]


class Backend(ABC):
    name: ClassVar[str] = ""
    # Distributions whose versions are logged with every run (importlib.metadata names).
    requires: ClassVar[tuple[str, ...]] = ()
    # dataset.decode=gpu: the backend can decode and augment RecordIO images on its GPUs
    decodes_on_gpu: ClassVar[bool] = False
    # the framework of the networks and data sets it trains (xp.plugin): "mxnet" or "torch"
    framework: ClassVar[str] = ""

    @classmethod
    def check(cls, plan: Plan) -> None:
        """Reject, with a ConfigError, plans this engine cannot run. Called before any run starts."""

    @classmethod
    def dataset_type(cls) -> tuple[type, str]:
        """The framework's data set class a registered data set may give (xp.plugin.Data), and its name in words."""
        raise NotImplementedError

    @classmethod
    def probe(cls, plan: Plan) -> Any:
        """xp.check's probe of the plan's network on one batch of its data (xp/mx/check.py, xp/pt/check.py)."""
        raise NotImplementedError

    @classmethod
    def check_devices(cls, plan: Plan) -> None:
        """Reject, with a ConfigError, plans the GPUs of the machine that trains cannot run (as the framework sees
        them). Called where the run trains: on this machine before it starts, unless a launcher places its
        processes on other hosts (their GPUs are not this machine's), and on each launched worker's host."""

    @classmethod
    def warm(cls) -> None:
        """Import what every run of this backend needs (its frameworks): a study's long-lived workers call it once,
        before their first trial, so no trial pays for it."""

    @classmethod
    def engine_for(cls, plan: Plan) -> type | None:
        """The engine that starts the run's processes (an xp.launching.engine.Engine beside the framework), or None:
        this process trains."""
        return None

    @classmethod
    def planned(cls, plan: Plan) -> Plan:
        """The plan with what this backend's own options change in it (MXNet's dist_async: the batch an update
        sees); called once, after `check`."""
        return plan

    @classmethod
    def in_group(cls, plan: Plan) -> Plan:
        """The plan a launched process was handed, as the process group it joined has it (an elastic runner that
        formed the group itself: torchrun's agent); called before the process plans anything else."""
        return plan

    @classmethod
    def for_plan(cls, plan: Plan) -> type[Backend]:
        """The class that runs `plan`: a plugin with variants (an API option) may pick one here."""
        return cls

    @classmethod
    def resolve_pretrained(cls, request: PretrainedRequest, model: ModelSpec) -> PretrainedSpec:
        """pretrained=: find the weights `request` names for `model` on disk (never download); a ConfigError
        naming what was tried when they are not there. Called while the plan is built."""
        from xp.errors import ConfigError

        raise ConfigError(f"pretrained={request.name}: backend={cls.name} cannot start from pretrained weights")

    @classmethod
    def fits(cls, plan: Plan) -> bool:
        """Whether a training step at plan.batch per device fits in memory (batch=auto)."""
        from xp.errors import ConfigError

        raise ConfigError(f"batch=auto: backend={cls.name} cannot measure memory; give batch=N")

    @abstractmethod
    def setup(self, plan: Plan) -> None:
        """Build the model, data iterators and optimizer state for `plan`.

        A distributed backend learns its worker rank here and keeps the plan with that
        rank in self.plan; the core reads self.plan.rank afterwards.
        """

    plan: Plan  # set by setup: the plan with this worker's rank (the core reads plan.rank from it)

    def save_state(self, folder: Path) -> None:
        """Write what training needs to continue (parameters, optimizer state) into `folder`."""
        from xp.errors import ConfigError

        raise ConfigError(f"checkpoint_dir: backend={self.name} cannot save its training state")

    def load_state(self, folder: Path) -> None:
        """Restore what save_state wrote (called by setup when the plan resumes)."""
        from xp.errors import ConfigError

        raise ConfigError(f"resume: backend={self.name} cannot restore a training state")

    def get_params(self) -> dict[str, Any]:
        """The current parameters by name, as numpy arrays of their own: a copy that later training steps leave as
        it is (the best epoch's model is kept this way; save_params writes them; tests compare them)."""
        from xp.errors import ConfigError

        raise ConfigError(f"save_params: backend={self.name} cannot export its parameters")

    def export_model(self, folder: Path, example: Any, extra: dict[str, str], params: dict[str, Any]) -> None:
        """Write the network with `params` (what get_params returned) as an MLflow model into `folder` (model.log):
        its predict takes inputs as the data set feeds them (`example`: a few) and answers the classes' scores;
        `extra`: files (name: text) to put beside it. A backend that does not override it logs no model."""

    def gather(self, value: float) -> list[float]:
        """Every worker's value (a collective: all workers call it), indexed by rank."""
        return [value]

    # --- what the core's batch loop (xp.run.train.train_epoch) asks of a backend -----------------------------
    draws: bool = False  # the network has random layers (dropout): the core reseeds them per step

    @abstractmethod
    def batches(self, epoch: int, skip: int) -> Iterable[Any]:
        """The training batches of `epoch` (1-based) in the epoch's order, less the first `skip` (trained before
        an interruption). The core stops after plan.steps_per_epoch."""

    @property
    def input_path(self) -> str:
        """Where the training batches are made, in words, once set up (the run's tag xp.input; diagnose=true
        reports it): by default the data set's reader, image files decoded by data_nthreads CPU threads."""
        d = self.plan.dataset
        if d.options.get("kind", d.name) in ("rec", "folder"):
            return f"cpu ({self.plan.data_nthreads} decode threads)"
        return "one synthetic batch in memory" if d.name == "synthetic" else "in-memory arrays"

    @abstractmethod
    def batch_size(self, batch: Any) -> int:
        """Samples in `batch` (all devices)."""

    def read(self, batch: Any) -> None:
        """test_io: make sure `batch` is decoded and in memory (the work the input pipeline must do)."""

    @abstractmethod
    def train_step(self, batch: Any, lr: float) -> Any:
        """One training step at learning rate `lr`: forward, backward, update. Returns the step's outputs (its
        logits and labels) as they are, without waiting for them: the core reads them with fetch a step later."""

    def fetch(self, outputs: Any) -> tuple[Any, Any]:
        """A step's logits and labels (what train_step returned) as numpy arrays: waits for its forward pass."""
        return outputs

    def sync(self) -> None:
        """Wait until every step given so far has finished (asynchronous engines: the updates too)."""

    def reseed(self, seed: int) -> None:
        """Seed the generator the network's random layers draw from (called per step when `draws`)."""

    @abstractmethod
    def evaluate(self) -> dict[str, float]:
        """Metrics on the validation set: val_loss, val_accuracy, val_top5_accuracy (classes > 5)."""
