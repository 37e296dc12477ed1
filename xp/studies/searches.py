"""Which search a study file names (xp.studies.search): the one place that knows the implementations by name;
the runners get the search and never ask which it is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xp.studies.search import Sampled, Search
from xp.studies.study import StudySpec

if TYPE_CHECKING:
    from optuna import Study


def search_for(study: Study, spec: StudySpec, config: Any) -> Search:
    """The search the study file names: the one place that knows which."""
    search: Search
    if spec.pbt is not None:
        from xp.studies.pbt import population

        search = population(study, spec, config)
    elif spec.warm_start:
        from xp.studies.warm import WarmStart

        search = WarmStart(study, spec)
    else:
        search = Sampled(study, spec)
    if spec.confirm:
        from xp.studies.confirm import Confirmation

        search = Confirmation(search, study, spec, int(config.get("seed") or 0))
    return search
