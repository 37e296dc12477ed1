"""Recipes: study files (sweeps/NAME.yaml) that carry their own experiment. Before Hydra composes anything, a
recipe's command line gets its `settings` (the command line wins), its batch ladder (`batch_ladder`: batch=auto's
largest per-device batch found once) and its pretraining (`pretrain`: one run whose weights the trials start
from). Every later step (the preflight, Hydra's sweep, the trials) sees the same command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

from xp import shipped
from xp.errors import ConfigError, XPError

CONF_DIR = shipped("conf")


def with_recipe(argv: list[str]) -> list[str]:
    """-m sweep=NAME where NAME is a recipe: its settings join the command line (recipe_settings)."""
    if "-m" not in argv and "--multirun" not in argv:
        return argv
    from hydra._internal.utils import get_args_parser

    config_dir = get_args_parser().parse_args(argv).config_dir
    return recipe_settings(argv, [Path(config_dir).expanduser()] if config_dir else [])


def recipe_settings(argv: list[str], dirs: Sequence[Path] = ()) -> list[str]:
    """A recipe's command line: the chosen study file's `settings` added to the command line's overrides (a key the
    command line sets or searches keeps the command line's value). Read from the file (sweeps/NAME.yaml,
    or sweep/NAME.yaml in a config directory), as every later step (preflight, Hydra's sweep, the trials) must
    see the same overrides."""
    import yaml

    from xp.studies.study import SWEEPS_DIR, study_settings_of

    chosen = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("sweep=")]
    if len(chosen) != 1 or "," in chosen[0]:
        return argv
    path = next((p for p in [SWEEPS_DIR / f"{chosen[0]}.yaml", *(Path(d) / "sweep" / f"{chosen[0]}.yaml" for d in dirs)]
                 if p.is_file()), None)
    try:
        raw = yaml.safe_load(path.read_text()) if path else None
    except yaml.YAMLError:
        return argv  # the preflight says what is wrong with the file
    if not isinstance(raw, dict) or not raw.get("settings"):
        return argv
    settings = study_settings_of(raw["settings"], f"sweeps/{chosen[0]}.yaml")
    given = {a.lstrip("+~").split("=", 1)[0] for a in argv if not a.startswith("-")}
    argv = [*argv, *(s for s in settings if s.split("=", 1)[0].lstrip("+~") not in given)]
    start = raw.get("batch_ladder")
    if isinstance(start, int) and not isinstance(start, bool) and start >= 1 and "batch" not in given:
        ladder = batch_ladder(argv, start, list(dirs))
        if ladder:
            argv += [f"batch=choice({','.join(map(str, ladder))})",
                     *([f"sweep.n_trials={len(ladder)}"] if "sweep.n_trials" not in given else [])]
    if raw.get("pretrain") and "pretrained" not in given:
        folder = pretrain(argv, study_settings_of(raw["pretrain"], f"sweep={chosen[0]}", "pretrain"), list(dirs))
        argv.append(f"pretrained=choice(none,{folder})")
    return argv


def batch_ladder(argv: list[str], start: int, dirs: list[Path]) -> list[int]:
    """A batch_ladder recipe's batches: start, 2 x start, 4 x start ... up to half batch=auto's largest per-device batch
    for this command's experiment (found once, here, as batch=auto finds it), then that largest. Empty when the
    command does not compose: the preflight then says why."""
    from hydra import compose, initialize_config_dir

    from xp.run.backend_plan import plan_and_backend
    from xp.studies.compose import plain

    try:
        fixed = [*_fixed(argv), *(a for a in argv if a.lstrip("+").startswith("sweep="))]
        searchpath = [f"hydra.searchpath=[{','.join(f'file://{d}' for d in dirs)}]"] if dirs else []
        with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="xp"):
            config = plain(compose("config", overrides=[*searchpath, *fixed, "batch=auto"]))
    except Exception:
        return []
    plan, _ = plan_and_backend(config, resolve_auto=True)
    ladder = [b for b in (start * 2 ** i for i in range(32)) if 2 * b <= plan.batch] + [plan.batch]  # (no 256, 263)
    print(f"xp: batch ladder: batch=auto fits {plan.batch} per device; trials at batch "
          f"{', '.join(map(str, ladder))}", file=sys.stderr)
    return ladder


def _fixed(argv: list[str]) -> list[str]:
    """The command line's overrides of one experiment: not a search space, not Hydra's, not the study."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(get_args_parser().parse_args(argv).overrides)
    return [str(o.input_line) for o in parsed if not o.is_sweep_override()
            and not o.key_or_group.startswith(("hydra", "sweep"))]


def pretrain(argv: list[str], overrides: tuple[str, ...], dirs: list[Path]) -> Path:
    """A recipe's pretraining (`pretrain`: overrides of the recipe's experiment, e.g. another data set): one xp run,
    its own MLflow run, before the study, committing its weights into a folder named by what it trains
    ($XP_CACHE_DIR/pretrained/KEY); the trials then start from it (pretrained=FOLDER) or from scratch
    (pretrained=none). The folder is marked finished when the run ends well, and reused from then on; a killed
    pretraining is run again (its seed makes the same weights, so two commands at once commit the same)."""
    import hashlib
    import json
    import subprocess

    from xp.preflight import preflight

    try:
        fixed = _fixed(argv)
    except Exception:
        preflight([a for a in argv if a not in ("-m", "--multirun")])  # says what cannot be parsed
        raise ConfigError("cannot parse the command line") from None
    preflight([*(f"--config-dir={d}" for d in dirs[:1]), *fixed])  # the trials' experiment is checked first
    keys = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    command = [*(o for o in fixed if o.lstrip("+~").split("=", 1)[0] not in keys | {"run_name"}), *overrides]
    key = hashlib.sha256(json.dumps(sorted(command)).encode()).hexdigest()[:12]
    folder = Path(os.environ.get("XP_CACHE_DIR") or "~/.cache/xp").expanduser() / "pretrained" / key
    shown = f"python -m xp {' '.join(command)} checkpoint_dir={folder}"
    if (folder / FINISHED).is_file():
        print(f"xp: pretraining: reusing the weights of {shown}", file=sys.stderr)
        return folder
    print(f"xp: pretraining: {shown}", file=sys.stderr, flush=True)
    name = next((a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("sweep=")), "")
    proc = subprocess.Popen([sys.executable, "-m", "xp", *(f"--config-dir={d}" for d in dirs[:1]), *command,
                             f"checkpoint_dir={folder}", "checkpoint.keep_last=1", f"run_name='pretraining, sweep={name}'"],
                            stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate()
    except BaseException:  # Ctrl-C, SIGTERM: the pretraining ends with this command
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    if proc.returncode != 0:
        said = [ln for ln in err.splitlines() if ln.startswith("xp: error: ")]
        why = said[-1][len("xp: error: "):] if said else f"exit {proc.returncode}"
        raise (ConfigError if proc.returncode == 2 else XPError)(f"the recipe's pretraining ({shown}) failed: {why}")
    sys.stderr.write(err)
    (folder / FINISHED).write_text("")
    return folder


FINISHED = ".finished"  # a recipe's pretraining ran to its end: its folder's weights are reused
