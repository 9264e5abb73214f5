"""The README and the manual (docs/*.md) stay true to the repository, without mkdocs.

`make docs` builds the site with ``mkdocs build --strict`` in its own venv; these checks run in the dev venv with
the rest of pytest: every link between the pages and every anchor resolves (as GitHub and mkdocs slug headings),
every command of the ``sasflow`` CLI and every API route of template.yaml is named somewhere, the README's picture
is the manual's, and the manual's example definitions are valid against the definition model and agents.yaml.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from devstack.agents import load_agents
from devstack.template import load_template
from sasflow.definition import MapStep, TaskStep, WorkflowDefinition, parse_definition
from sasflow_cli.app import app as cli_app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The text without code blocks and inline code, where a ``[x](y)`` is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub and mkdocs' toc give a heading: lower case, markup and punctuation dropped, spaces to -.

    >>> slug("Latency and cost: the batching windows")
    'latency-and-cost-the-batching-windows'
    >>> slug("The `sasflow` CLI")
    'the-sasflow-cli'
    """
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[`*_]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r"[\s-]+", "-", text)


def anchors(path: Path) -> set[str]:
    return {slug(m.group(2)) for m in HEADING.finditer(FENCE.sub("", path.read_text(encoding="utf-8")))}


def links(path: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(_prose(path.read_text(encoding="utf-8")))]


def broken_links(path: Path) -> list[str]:
    """The internal links of ``path`` whose file, or whose anchor in that file, does not exist."""
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check offline
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{target} (no such anchor)")
    return broken


def cli_commands() -> list[str]:
    """Every command path of the ``sasflow`` CLI, sub-commands as ``group command`` (e.g. ``dlq redrive``)."""
    found: list[str] = []

    # Typer's groups are its own (vendored) click's: read their ``commands`` rather than test their class.
    def walk(command: Any, path: list[str]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                walk(sub, [*path, name])
        else:
            found.append(" ".join(path))

    walk(typer.main.get_command(cli_app), [])
    return found


def api_routes() -> list[str]:
    """Every HTTP API route of template.yaml as ``METHOD /path``: the ``AWS::ApiGatewayV2::Route`` resources and the
    functions' ``HttpApi`` events."""
    routes = []
    for resource in load_template(ROOT / "template.yaml")["Resources"].values():
        properties = resource.get("Properties", {})
        if resource["Type"] == "AWS::ApiGatewayV2::Route":
            routes.append(properties["RouteKey"])
        for event in properties.get("Events", {}).values():
            if event["Type"] == "HttpApi":
                routes.append(f"{event['Properties']['Method'].upper()} {event['Properties']['Path']}")
    return routes


def _params_blank(text: str) -> str:
    """``GET /workflows/{workflow_id}`` and ``GET /workflows/{id}`` name the same route."""
    return re.sub(r"\{[^{}/\s]*\}", "{}", text)


def all_text() -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_internal_link_and_anchor_resolves(page: Path) -> None:
    # Given a page of the README or the manual / When its links are followed / Then each file and anchor exists
    assert broken_links(page) == []


def test_the_link_check_sees_a_broken_anchor_and_a_missing_page(tmp_path: Path) -> None:
    # Given a page with one good link and two broken ones
    (tmp_path / "a.md").write_text("# Title\n\n## The `x` part\n", encoding="utf-8")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#the-x-part) [no](a.md#the-y-part) [gone](c.md) `[code](c.md)`\n", encoding="utf-8")
    # When it is checked / Then exactly the two broken ones are reported
    assert broken_links(page) == ["a.md#the-y-part (no such anchor)", "c.md (no such file)"]


def test_the_readme_links_every_page_of_the_manual() -> None:
    # Given the README / When its links are read / Then every page of docs/ is one of them
    readme_links = {target.partition("#")[0] for target in links(ROOT / "README.md")}
    assert {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")} <= readme_links


def test_every_cli_command_is_named_in_the_docs() -> None:
    # Given the typer app's commands and sub-commands
    commands = cli_commands()
    assert {"start", "get", "retry-compensation", "dlq list", "dlq redrive", "definitions push"} <= set(commands)
    # When the README and the manual are searched for `command or "sasflow [options] command"
    text = all_text()
    missing = [
        c
        for c in commands
        if not re.search(r"(?:`|\bsasflow(?: --?[\w-]+(?: [^\s`-]\S*)?)* )" + re.escape(c) + r"(?![\w-])", text)
    ]
    # Then each is named
    assert missing == []


def test_every_api_route_is_named_in_the_docs() -> None:
    # Given template.yaml's routes (the clients', the operators', the sample services')
    routes = api_routes()
    assert {"POST /workflows", "POST /ops/dead-letters/redrive", "POST /sample/{service}/{action}"} <= set(routes)
    # When the README and the manual are searched for "METHOD /path" (path parameters by any name)
    text = _params_blank(all_text())
    missing = [r for r in routes if not re.search(re.escape(_params_blank(r)) + r"(?![\w/{}.-])", text)]
    # Then each is named
    assert missing == []


def test_the_readme_and_the_manual_show_the_same_architecture_picture() -> None:
    # Given the mermaid diagrams of the README and of docs/concepts.md / Then they are one picture
    def mermaid(path: Path) -> list[str]:
        return re.findall(r"^```mermaid\n(.*?)^```", path.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)

    assert len(mermaid(ROOT / "README.md")) == 1
    assert mermaid(ROOT / "README.md") == mermaid(ROOT / "docs" / "concepts.md")


def test_the_manuals_example_definitions_are_valid() -> None:
    # Given every JSON example of docs/definitions.md that holds a whole definition
    text = (ROOT / "docs" / "definitions.md").read_text(encoding="utf-8")
    examples = [json.loads(block) for block in re.findall(r"^```json\n(.*?)^```", text, re.MULTILINE | re.DOTALL)]
    definitions = [e["definition"] for e in examples if "steps" in (e.get("definition") or {})]
    assert len(definitions) >= 2
    accepted = {agent.name: set(agent.actions) for agent in load_agents(ROOT / "agents.yaml")}
    kinds: set[str] = set()
    for raw in definitions:
        # When each is parsed by the definition model
        definition = parse_definition(raw)

        # Then it is valid, and every agent action it names is one agents.yaml declares
        def tasks(d: WorkflowDefinition) -> list[TaskStep]:
            found = []
            for step in d.steps:
                kinds.add(step.type)
                if isinstance(step, TaskStep):
                    found.append(step)
                if isinstance(step, MapStep):
                    found.extend(tasks(step.definition))
            return found

        for step in tasks(definition):
            assert step.action in accepted[step.agent]
            if step.compensation is not None:
                assert step.compensation.action in accepted[step.agent]
        if any(step.when for step in definition.steps):
            kinds.add("when")
    # And together they show every kind of step, and a condition
    assert {"task", "wait", "callback", "map", "when"} <= kinds


def test_the_site_is_built_without_the_network() -> None:
    # Given mkdocs.yml (its python/name tags read as their names)
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/name:", lambda loader, suffix, node: suffix)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)  # safe + names
    # Then the theme loads no web fonts, and no plugin that fetches (the social cards' fonts, the privacy plugin's
    # downloads) is on: only the search index, built with the site
    assert config["theme"]["name"] == "material"
    assert config["theme"]["font"] is False
    assert [p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]] == ["search"]
    # And the diagram's mermaid block is drawn by the mermaid shipped with the site, never the theme's CDN copy
    # (the theme fetches one only when no mermaid is loaded): a local script, fetched at build time by make docs
    fences = json.dumps(config["markdown_extensions"])
    assert '"name": "mermaid"' in fences
    assert config["extra_javascript"] == ["assets/javascripts/mermaid.min.js"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "MERMAID_JS := docs/assets/javascripts/mermaid.min.js" in makefile
    assert re.search(r"^MERMAID_VERSION := \d+\.\d+\.\d+$", makefile, re.MULTILINE)  # pinned, not a range
    # And every page of docs/ is in the nav (strict mode fails on one left out; this says which)
    nav_pages = {next(iter(entry.values())) for entry in config["nav"]}
    assert nav_pages == {page.name for page in (ROOT / "docs").glob("*.md")}
