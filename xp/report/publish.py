"""A report's files logged on an MLflow run (the sweep's or study's parent, or the run `--run` names), under
report/: the PNG plots, report.md, and report.html, the report as one page with its plots inside it, which
MLflow's artifact view shows as it is (its Markdown preview drops images of relative or data: links)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def publish(client: Any, target: str, out: Path, ui: str) -> None:
    """Log the report's files on `target` (the sweep's parent, or the run --run names) under report/, with
    report.html: the report as one page, its plots inside it, which MLflow's artifact view shows as it is (its
    Markdown preview drops images of relative or data: links). The logged report.md's images link to the UI at
    `ui` where one is given (the preview shows absolute links), else beside it, as on disk."""
    import tempfile
    from urllib.parse import quote

    from mlflow.exceptions import MlflowException

    from xp.errors import XPError, one_line

    try:
        client.get_run(target)
    except MlflowException as e:
        raise XPError(f"--run {target}: no such run in {client.tracking_uri} ({one_line(e)[:160]})") from None
    text = (out / "report.md").read_text()
    (out / "report.html").write_text(html_page(text, out))
    client.log_artifacts(target, str(out), "report")
    link = lambda name: f"{ui.rstrip('/')}/get-artifact?path={quote('report/' + name, safe='')}&run_uuid={target}"  # noqa: E731
    for png in out.glob("*.png") if ui else []:
        text = text.replace(f"]({png.name})", f"]({link(png.name)})")
    if not ui:
        title, rest = text.split("\n", 1)
        text = f"{title}\n\n(The plots are this folder's PNG files; report.html shows them in MLflow's UI.)\n{rest}"
    with tempfile.TemporaryDirectory(prefix="xp-report-") as tmp:
        (Path(tmp) / "report.md").write_text(text)
        client.log_artifact(target, str(Path(tmp) / "report.md"), "report")


def html_page(markdown_text: str, folder: Path) -> str:
    """The report as one HTML page, its PNG plots inlined (data: URIs): it needs nothing beside it."""
    import base64
    import html
    import re

    import markdown

    def inline(m: re.Match) -> str:
        png = folder / m.group(2)
        if not png.is_file():
            return m.group(0)
        return f"![{m.group(1)}](data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()})"

    body = markdown.markdown(re.sub(r"!\[([^\]]*)\]\(([^)/]+\.png)\)", inline, markdown_text),
                             extensions=["tables"])
    title = html.escape(markdown_text.split("\n", 1)[0].lstrip("# "))
    style = ("body{font-family:sans-serif;margin:1em;max-width:1400px} table{border-collapse:collapse;font-size:13px}"
             " td,th{border:1px solid #ccc;padding:2px 6px;text-align:left} img{max-width:100%}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{style}</style></head>" \
           f"<body>{body}</body></html>"
