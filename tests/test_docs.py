"""The documentation cannot rot: the site builds strictly, the configuration reference is what conf/ says, every
shell block either runs here (the getting-started page's, on a CPU) or says what it needs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

DOCS = ROOT / "docs"
BLOCK = re.compile(r"^( *)```bash\n(.*?)^ *```", re.S | re.M)


def bash_blocks(page: Path) -> list[str]:
    """The page's ```bash blocks (in list items too), dedented."""
    import textwrap

    return [textwrap.dedent(body) for _, body in BLOCK.findall(page.read_text())]


def test_the_site_builds_strictly(tmp_path):
    mkdocs = Path(sys.executable).parent / "mkdocs"
    out = subprocess.run([str(mkdocs), "build", "--strict", "-d", str(tmp_path / "site")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for page in ("getting-started", "guides/studies", "reference/configuration", "reference/plugins", "reliability"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page
    api = (tmp_path / "site" / "reference" / "plugins" / "index.html").read_text()
    assert "export_model" in api and "read_options" in api  # the interfaces' methods, from their docstrings


def test_the_configuration_reference_is_conf_as_it_is():
    from xp.confref import reference
    from xp.preflight import CONF_DIR

    page = (DOCS / "reference" / "configuration.md").read_text()
    assert page == reference(CONF_DIR), "regenerate it: python -m xp.confref > docs/reference/configuration.md"

    def flat(node, prefix=""):
        for k, v in (node or {}).items():
            yield prefix + str(k)
            if isinstance(v, dict):
                yield from flat(v, prefix + f"{k}.")

    top = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
    for key in flat({k: v for k, v in top.items() if k not in ("defaults", "hydra", "optuna")}):
        assert f"`{key}`" in page, key
    for file in CONF_DIR.glob("*/*.yaml"):  # every option of every group, each of its keys
        assert f"`{file.parent.name}={file.stem}`" in page, file
        for key in flat(yaml.safe_load(file.read_text())):
            assert f"`{file.parent.name}.{key}`" in page, (file, key)


def test_every_other_shell_block_says_what_it_needs():
    for page in DOCS.rglob("*.md"):
        if page.name in RUN:  # their blocks run in tests below
            continue
        text = page.read_text()
        for test in re.findall(r"`(tests/test_\w+\.py)(?:::(\w+))?`", text):  # the tests a page names exist
            assert (ROOT / test[0]).is_file() and (not test[1] or f"def {test[1]}(" in (ROOT / test[0]).read_text()), \
                (page, test)
        for block in bash_blocks(page):
            assert block.startswith("# needs: "), f"{page.relative_to(ROOT)}: a block that neither runs in a test " \
                                                  f"nor says what it needs:\n{block}"


RUN = ("getting-started.md", "own-code.md")


def run_blocks(page: Path, tmp_path: Path, at_least: int) -> str:
    """The page's blocks not marked `# needs:`, in order, as a reader types them in a checkout (here: a folder with
    the checkout's .venv, so that its default stores are the test's own); what they printed."""
    blocks = [b for b in bash_blocks(page) if not b.startswith("# needs:")]
    assert len(blocks) >= at_least, blocks
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "XP_OPTUNA_STORAGE",
                                                           "XP_PARENT_RUN_ID")}
    said = ""
    for block in blocks:
        out = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, f"{block}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
        assert "Traceback" not in out.stdout + out.stderr, block
        said += out.stdout + out.stderr
    return said


@pytest.mark.slow
def test_the_own_code_pages_commands_run(tmp_path):
    """docs/guides/own-code.md's blocks not marked `# needs:`, in order, in a folder with the checkout's .venv: the
    example's names listed, checked on both frameworks, trained on both."""
    said = run_blocks(DOCS / "guides" / "own-code.md", tmp_path, 3)
    assert "tinynet, tinynet_bn" in said and said.count("  N workers  ok") == 2, said
    assert said.count("| tinynet |") == 2 and said.count("FINISHED |") == 2, said


@pytest.mark.slow
def test_the_getting_started_commands_run(tmp_path):
    """Each block of the page not marked `# needs:`, in order, as a reader types it in a checkout (here: a folder
    with the checkout's .venv, so that its default stores are the test's own)."""
    said = run_blocks(DOCS / "getting-started.md", tmp_path, 5)
    assert (tmp_path / "mlruns" / "optuna.db").is_file() and (tmp_path / "mlruns" / "mlflow.db").is_file()
    # what the Compare block made: the study's trials as a study, the other runs as runs, nothing drawn empty
    first = tmp_path / "reports" / "first"
    md = (first / "report.md").read_text()
    assert "There are no complete trials" not in said
    counted = int(re.search(r"^(\d+) runs", md, re.M).group(1))
    table = [line for line in md.split("## Trials")[0].splitlines() if line.startswith("| ") and "---" not in line]
    pruned = md.split("### Pruned trials")[1].split("##")[0].count("| PRUNED |") if "### Pruned" in md else 0
    assert counted == len(table) - 1 + pruned, md[:3000]  # the header says what the tables hold
    assert table[0].count("| epochs |") == 1, table[0]
    searched = re.search(r"^Searched: (.*)\. (\d+) complete, (\d+) pruned\.$", md, re.M)
    assert searched and searched.group(1) == "batch, lr, momentum", md
    assert int(searched.group(2)) + int(searched.group(3)) == 6  # the page's study: 6 trials, none of the others
    import matplotlib.image
    import numpy as np

    for name in ("optimization_history", "parallel_coordinate", "slice"):  # drawn, not empty axes
        image = matplotlib.image.imread(first / f"study_{name}.png")
        assert image.shape[0] > 100 and len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 20, name
