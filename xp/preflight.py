"""Before anything runs: every job the command line describes (each combination of a -m sweep, each study's
search space) composed with Hydra and validated into a plan, so a bad value fails in a second with one line,
not after an hour of the sweep. Imports no framework; plans through xp.run.backend_plan.plan_and_backend."""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xp import shipped
from xp.errors import ConfigError, one_line

if TYPE_CHECKING:
    from xp.studies.study import StudySpec

CONF_DIR = shipped("conf")


@dataclass(frozen=True)
class Checked:
    """What the command line asks, composed and checked: each job's resolved config, and the study's spec (its
    settings and search space, read once here) where the command is a study."""
    configs: list[dict[str, Any]]
    study: StudySpec | None = None


def study_fields() -> tuple[str, ...]:
    from xp.studies.study import FIELDS

    return tuple(f for f in FIELDS if f != "name")


def _groups(dirs: list[Path]) -> dict[str, list[str]]:
    """Each config group's options: xp's, the study files, and those of the user's config directories."""
    from xp.studies import study

    from xp.launching.launcher import launchers

    from xp import models
    from xp.data import plugins

    groups: dict[str, set[str]] = {"sweep": set(study.names()), "launcher": set(launchers().names()),
                                   "model": set(models.names()), "dataset": set(plugins.names())}
    for d in [CONF_DIR, *dirs]:
        for g in (p for p in d.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            groups.setdefault(g.name, set()).update(f.stem for f in g.glob("*.yaml"))
    return {g: sorted(options) for g, options in groups.items()}


def _user_dirs(config_dir: str | None, overrides: list[Any]) -> list[Path]:
    """The user's config directories: --config-dir, and file:// entries of hydra.searchpath=[...]."""
    dirs = [Path(config_dir).expanduser().resolve()] if config_dir else []
    for o in overrides:
        if o.key_or_group == "hydra.searchpath" and not o.is_delete():
            for entry in o.value() or []:
                if str(entry).startswith("file://"):
                    dirs.append(Path(str(entry)[len("file://"):]).expanduser().resolve())
    for d in dirs:
        if not d.is_dir():
            raise ConfigError(f"config directory {d}: no such folder")
    return dirs


def _parse_advice(overrides: list[str]) -> str | None:
    """Hydra's parser on a value with a space (dataset.root=/data/my dir): the shell split it, or Hydra's grammar
    needs it quoted. Say so, with the quoted spelling."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for i, o in enumerate(overrides):
        if "=" not in o and i > 0 and "=" in overrides[i - 1]:  # the shell split KEY=a b into two arguments
            key, value = overrides[i - 1].split("=", 1)
            return (f"cannot parse the command line: {o!r} is not KEY=VALUE; if it belongs to {key}'s value, quote "
                    f"the whole value for the shell and for Hydra: \"{key}='{value} {o}'\"")
        key, _, value = o.partition("=")
        if " " in value.strip() and not value.startswith(("'", '"')):
            try:
                parser.parse_override(o)
            except Exception:
                return (f"cannot parse the command line: {o}: a value with spaces (and with Hydra's ()[]{{}},: in "
                        f"it) must be quoted for Hydra: \"{key}='{value}'\"")
    return None


def _composition_error(e: Exception, override: list[str], known_keys: Sequence[str]) -> ConfigError:
    text = str(e) + ("\n" + str(e.__cause__) if e.__cause__ else "")
    for o in override:
        key = o.split("=", 1)[0].lstrip("+~")
        if f"Key '{key.split('.')[-1]}' is not in struct" in text or f"Could not override '{key}'" in text:
            moved = _moved(o)
            if moved:
                return moved
            close = ([k for k in known_keys if k.endswith("." + key)]
                     or difflib.get_close_matches(key, known_keys, n=1))
            hint = f"did you mean {close[0]}?" if close else "see python -m xp --help"
            if close and close[0] == key:  # a key of another option of its group (dataset.root is folder's)
                group = key.split(".", 1)[0]
                hint = f"the chosen {group} has no such key; it is one of another {group} option (choose it: {group}=...)"
            return ConfigError(f"{o}: unknown key {key!r}; {hint}")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    why = next((ln for ln in lines if "could not be converted" in ln), None)
    if why:  # a typed field (a study's): "Value 'abc' of type 'str' could not be converted to Integer"
        bad = next((o for o in override if o in lines[0]), lines[0])
        return ConfigError(f"{bad}: {why.split('full_key')[0].strip()}")
    return ConfigError(" ".join(lines[:2]) or type(e).__name__)


RENAMED = {"checkpoint_keep": "checkpoint.keep_last"}  # keys of earlier versions: their names now


def _moved(override: str) -> ConfigError | None:
    """A renamed key, or a launcher's setting given under the key it had before launchers brought their own: the
    key now."""
    from xp.launching.launcher import moved_key

    key, _, value = override.lstrip("+~").partition("=")
    if key in RENAMED:
        return ConfigError(f"{override}: now {RENAMED[key]}={value}")
    moved = moved_key(key)
    if moved is None:
        return None
    name, now = moved
    return ConfigError(f"{override}: now a setting of launcher={name}: write launcher={name} {now}={value}")


def preflight(argv: list[str]) -> Checked:
    """Compose and validate every job of the command line; return their resolved configs and the study's spec
    (no config in a launched worker, or for another config tree, whose jobs validate as they start)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from xp.launching.hydra_launchers import chosen, runs_elsewhere
    from xp.launching.launcher import gpus_here, launcher_for
    from xp.run.backend_plan import plan_and_backend
    from xp.run.worker import WORKER_ENV
    from xp.studies.compose import Composer, as_override, plain

    if os.environ.get(WORKER_ENV):
        return Checked([])  # a launched worker: its launching process composed and checked this job
    args = get_args_parser().parse_args(argv)
    if args.config_path or args.config_name:
        return Checked([])  # another config tree: Hydra composes it; each job still validates as it starts
    try:
        parsed = OverridesParser.create().parse_overrides(args.overrides)
    except Exception as e:
        raise ConfigError(_parse_advice(args.overrides) or f"cannot parse the command line: {one_line(e)}") from e
    dirs = _user_dirs(args.config_dir, parsed)  # the user's own options, beside xp's
    searchpath = [f"hydra.searchpath=[{','.join(f'file://{d}' for d in dirs)}]"] if dirs else []
    groups = _groups(dirs)
    _check_options(parsed, groups)
    jobs, space = _jobs([o for o in parsed if not o.key_or_group.startswith("hydra")], args.multirun)

    configs = []
    with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="xp"):
        known = _KnownKeys(lambda: _known_keys(compose, groups, dirs))  # composed only if asked (0.2 s)
        _check_added(parsed, known, groups)
        jobs = [[*searchpath, *job] for job in jobs]
        here = not runs_elsewhere(chosen(argv))
        # Hydra's own settings go into every composition (they leave the job's config as it is): checked now, or a
        # sweep fails after its parent run began
        hydra_overrides = [o.input_line for o in parsed if o.input_line
                           and o.key_or_group.startswith("hydra") and o.key_or_group != "hydra.searchpath"]
        composer = Composer(lambda name, overrides: compose(name, overrides=[*hydra_overrides, *overrides]))
        corners, spec = _study_jobs(jobs, args.multirun, known, composer, space, here)
        for job, params in corners or [(job, {}) for job in jobs]:
            try:
                config = plain(composer(job, params))
            except Exception as e:
                raise _composition_error(e, [*job, *(as_override(k, v) for k, v in params.items()), *hydra_overrides],
                                         known) from e
            launcher_for(plan_and_backend(config, gpus_here=gpus_here(config))[0])  # its launcher, made and checked
            configs.append(config)
    return Checked(configs, spec)


def _check_options(parsed: list[Any], groups: dict[str, list[str]]) -> None:
    """No _target_ from the command line; every group option exists."""
    for o in parsed:
        key = o.key_or_group
        if "_target_" in key.split(".") or "_target_" in key.split("/"):
            # Hydra instantiates _target_ (hydra.callbacks too): from a command line that is running any code
            raise ConfigError(f"{o.input_line}: setting _target_ from the command line is refused; xp builds only "
                              "registered backends (backend=NAME) and the targets of its own config files")
        if key in ("model.factory", "dataset.factory"):  # an import path: code to run, from a config file only
            raise ConfigError(f"{o.input_line}: an import path on the command line is refused; choose a registered "
                              f"name ({key.split('.')[0]}=NAME: python -m xp.check --list), or write {key} in a "
                              "config file of your own config directory (--config-dir)")
        if key in groups and not o.is_delete():
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            for v in values:
                if v not in groups[key]:
                    what = "study" if key == "sweep" else key
                    close = difflib.get_close_matches(v, groups[key], n=1, cutoff=0.75)
                    raise ConfigError(f"{key}={v}: no such {what}; " + (f"did you mean {key}={close[0]}? " if close
                                                                        else "") + f"valid: {', '.join(groups[key])}")


def _jobs(user: list[Any], multirun: bool) -> tuple[list[list[str]], tuple[Any, ...]]:
    """The jobs the overrides describe, and a study's search space given on the command line."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    _check_study_fields(user)
    space: tuple[Any, ...] = ()
    if multirun and any(o.key_or_group == "sweep" and not o.is_delete() for o in user):
        # a study: KEY=interval(...)/choice(...)/range(...)/a,b are its search space, not jobs
        from xp.studies.overrides import space_from_overrides

        space, rest = space_from_overrides(user)
        user = OverridesParser.create().parse_overrides(rest)
    if multirun:
        try:
            return [job for batch in BasicSweeper.split_arguments(user, None) for job in batch], space
        except Exception as e:
            raise ConfigError(one_line(e)) from e
    sweeps = [o.input_line for o in user if o.is_sweep_override()]
    if sweeps:
        raise ConfigError(f"{sweeps[0]}: several values need a sweep; add -m to run one experiment per value")
    return [[o.input_line for o in user]], space


def _known_keys(compose: Any, groups: dict[str, list[str]], dirs: list[Path]) -> list[str]:
    """Every key a config can have: the defaults', and those of every option (dataset.root lives in folder.yaml)."""
    import yaml

    from xp.run.plan import flatten
    from xp.studies.compose import plain

    from dataclasses import fields

    from xp.launching.launcher import launchers

    known = set(flatten(plain(compose("config"))))
    known.update(f"launcher.{f.name}" for name in launchers().names() for f in fields(launchers().load(name).Options))
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # only the top keys: libyaml's parser, 15x OmegaConf's
    for group in groups:
        for f in (f for d in [CONF_DIR, *dirs] for f in (d / group).glob("*.yaml")):
            known.update(f"{group}.{k}" for k in yaml.load(f.read_text(), Loader=loader) or {})
    return sorted(known)


class _KnownKeys(Sequence):
    """Every key a config can have (_known_keys), composed the first time it is read: a command with no +KEY,
    no study and no error never needs it."""

    def __init__(self, make: Callable[[], list[str]]):
        self._make = make
        self._keys: list[str] | None = None

    def _all(self) -> list[str]:
        if self._keys is None:
            self._keys = self._make()
        return self._keys

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())


def _check_added(parsed: list[Any], known: Sequence[str], groups: dict[str, list[str]]) -> None:
    """+KEY=V (and ++KEY=V) adds a key Hydra did not have: one xp does not know would be silently unused."""
    added = [o for o in parsed if (o.is_add() or o.is_force_add())
             and not o.key_or_group.startswith(("hydra", "sweep")) and o.key_or_group not in groups]
    if not added:
        return
    known = list(known)
    sections = {k.rsplit(".", 1)[0] for k in known if "." in k}
    for o in added:
        key = o.key_or_group
        if key not in known and key not in sections:
            moved = _moved(o.input_line)
            if moved:
                raise moved
            close = ([k for k in known if k.endswith("." + key)] or difflib.get_close_matches(key, known, n=1))
            raise ConfigError(f"{o.input_line}: xp has no key {key!r}, nothing would read it"
                              + (f"; did you mean {close[0]}?" if close else "; see python -m xp --help"))


def _check_study_fields(overrides: list[Any]) -> None:
    """sweep.FIELD=V: a field of a study, and a study chosen with it."""
    chosen = any(o.key_or_group == "sweep" and not o.is_delete() for o in overrides)
    for o in overrides:
        if not o.key_or_group.startswith("sweep."):
            continue
        field = o.key_or_group.split(".")[1]
        if field not in study_fields():
            close = difflib.get_close_matches(field, study_fields(), n=1)
            raise ConfigError(f"{o.input_line}: a study has no field {field!r}"
                              + (f"; did you mean sweep.{close[0]}?" if close else f"; fields: {', '.join(study_fields())}"))
        if not chosen:
            raise no_study(o.input_line)


def no_study(override: str) -> ConfigError:
    from xp.studies.study import names

    return ConfigError(f"{override}: sets a field of a study; choose the study too: -m sweep=NAME "
                       f"(studies: {', '.join(names())})")


Corners = list[tuple[list[str], dict[str, Any]]]  # a study's jobs: each one's overrides and its corner's parameter


def _study_jobs(jobs: list[list[str]], multirun: bool, known: Sequence[str], composer: Any,
                space: tuple[Any, ...], here: bool = True) -> tuple[Corners, StudySpec | None]:
    """With sweep=NAME: check the study (its file, sweep.* overrides, a search space given on the command line)
    and return its spec and one job per corner of its search space (each choice, each bound: the command line's
    overrides and the corner's parameter), so a value the plan refuses fails now, not in trial 17. `here`: the
    trials run on this machine or xp's launcher's hosts (not a cluster's Hydra launcher), which its budget prices. (Whether
    the launcher can place them is the placement's to check: xp.launching.placement.)"""
    from xp.studies import study
    from xp.studies.compose import plain
    from xp.studies.budget import check_budget
    from xp.studies.trial import check_storage

    base = jobs[0]
    try:
        config = plain(composer(base))
    except Exception:
        return [], None  # composition errors are reported by the caller
    node = config.get("sweep")
    if not node:
        return [], None
    name = node.get("name") or next(o.split("=", 1)[1] for o in base if o.lstrip("+").startswith("sweep="))
    if not multirun:
        if (config.get("optuna") or {}).get("trial_id") is not None:
            return [], None  # a trial's launched process (sweep.scheduler=hydra): its sweeper checked the study
        raise ConfigError(f"sweep={name}: a study runs many experiments; add -m")
    for p in space:
        if p.name not in known:
            close = difflib.get_close_matches(p.name, known, n=1)
            raise ConfigError(f"{p.name}: not a parameter xp knows" + (f"; did you mean {close[0]}?" if close else ""))
    spec = study.spec_from(node, name, set(known), extra=space, overrides=base)
    if spec.pbt is not None:  # (a population needs its experiment's epochs and a budget for every member)
        from xp.studies.pbtspec import check_run

        check_run(spec.pbt, config.get("epochs"), spec.n_trials, f"sweep={name}")
    check_storage(spec.storage)
    if spec.warm_start:  # (the earlier study it starts from: there, and asking the same objectives)
        from xp.studies.warm import source_of

        source_of(spec)
    check_budget(spec, config, here)
    from dataclasses import replace

    from xp.studies import question

    spec = replace(spec, question=question.question_of(config, spec))
    question.check(spec, spec.question or {})  # (an existing study that asks another question: refused now)
    return [(base, {p.name: int(v) if p.kind == "int" else v}) for p in spec.params
            for v in (p.choices if p.kind == "categorical" else (p.low, p.high))], spec


def sweeper_spelling(argv: list[str]) -> list[str]:
    """hydra-optuna-sweeper's spelling, accepted with a pointer: hydra.sweeper.FIELD=V is sweep.FIELD=V and
    hydra.sweeper.params.KEY=SPACE is KEY=SPACE (xp's studies are the config group `sweep`)."""
    out = []
    chosen = any(a.lstrip("+").startswith("sweep=") for a in argv)
    for a in argv:
        key, eq, value = a.lstrip("+~").partition("=")
        if not key.startswith("hydra.sweeper.") or not eq:
            out.append(a)
            continue
        if not chosen:
            raise no_study(a)
        rest = key[len("hydra.sweeper."):]
        mine = rest[len("params."):] if rest.startswith("params.") else f"sweep.{rest}"
        if mine.startswith("sweep.") and rest not in study_fields():
            raise ConfigError(f"{a}: xp's studies have no field {rest!r}; they take sweep.FIELD=VALUE with "
                              f"FIELD one of {', '.join(study_fields())}")
        print(f"xp: note: {a}: xp's studies are the config group sweep: taken as {mine}={value}", file=sys.stderr)
        out.append(f"{mine}={value}")
    return out
