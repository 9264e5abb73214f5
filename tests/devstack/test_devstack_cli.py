"""devstack.cli: ``resources`` prints the table; ``up`` serves until interrupted; one LocalStack per process."""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import devstack.cli
from devstack.cli import app, example_requests, parse_parameters
from devstack.stack import LocalStack
from devstack.template import Stack

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_resources_lists_every_resource_and_how(mini_template: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI's console takes its width when devstack.cli is first imported, by whichever test (COLUMNS below only
    # reaches a console made during the call): a narrow one wraps the table's cells and the lines below split.
    monkeypatch.setattr(devstack.cli, "console", Console(width=250))
    result = CliRunner().invoke(
        app, ["resources", "--template", str(mini_template), "--param", "WithExtras=true"], env={"COLUMNS": "250"}
    )
    assert result.exit_code == 0, result.output
    lines = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") >= 3}
    assert "created in moto: queue sasflow-ExtraQueue" in lines["ExtraQueue"]
    assert "created in moto: table sasflow-ItemsTable" in lines["ItemsTable"]
    assert "emulated in-process" in lines["WorkerFunction"] and "SQS WorkQueue (batch 5)" in lines["WorkerFunction"]
    assert "emulated in-process" in lines["Api"]


def test_resources_reports_a_bad_parameter(mini_template: Path) -> None:
    result = CliRunner().invoke(app, ["resources", "--template", str(mini_template), "--param", "Nope=1"])
    assert result.exit_code == 2
    assert "unknown parameter" in result.output


def test_parse_parameters() -> None:
    assert parse_parameters(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}


def test_example_requests(mini_template: Path) -> None:
    commands = example_requests(Stack.from_file(mini_template), "http://127.0.0.1:3000")
    assert commands == [
        "curl -sS -X POST http://127.0.0.1:3000/items -H 'content-type: application/json' -d '{}'",
        "curl -sS -X GET http://127.0.0.1:3000/items/example",
    ]


def test_one_local_stack_per_process_and_environment_restored(mini_template: Path, tmp_path: Path) -> None:
    before = {name: os.environ.get(name) for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID")}
    with LocalStack(mini_template, log_dir=tmp_path / "logs", start_schedules=False) as local:
        assert os.environ["AWS_ENDPOINT_URL"] == local.endpoint_url
        with pytest.raises(RuntimeError, match="already running"):
            LocalStack(mini_template, log_dir=tmp_path / "logs").start()
    assert {name: os.environ.get(name) for name in before} == before
    assert local.pools == {} and local.pollers == []


def test_up_serves_until_interrupted(mini_template: Path, tmp_path: Path) -> None:
    # Given `python -m devstack up` on a free port
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200"}
    process = subprocess.Popen(
        [sys.executable, "-m", "devstack", "up", "--port", "0", "--template", str(mini_template),
         "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in process.stdout or []:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    output: list[str] = []
    try:
        # When it reports ready (bounded wait)
        deadline = time.monotonic() + 60
        while not any("ready" in line for line in output) and time.monotonic() < deadline:
            try:
                output.append(lines.get(timeout=1))
            except queue.Empty:
                assert process.poll() is None, "".join(output)
        assert any("ready" in line for line in output), "".join(output)
        api_url = next(line.split()[-1] for line in output if line.startswith("HTTP API"))

        # Then the URLs (the API's, the console's) and the next commands come first, the resources only on --verbose
        text = "".join(output)
        assert output[0].startswith("HTTP API") and output[1].startswith("console") and output[4].startswith("next")
        assert f"sasflow --url {api_url} list" in output[5] + output[6]
        console_url = output[1].split()[1]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{40,}", console_url), console_url
        # And the console answers on loopback: its token gives a strict cookie, nothing is served without one
        split = urllib.parse.urlsplit(console_url)
        opened = http.client.HTTPConnection(split.hostname or "", split.port, timeout=10)
        opened.request("GET", f"/?{split.query}")
        first = opened.getresponse()
        assert first.status == 303 and "SameSite=Strict" in (first.getheader("Set-Cookie") or "")
        opened.close()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{split.port}/", timeout=10)
        assert refused.value.code == 403
        assert "created in moto" not in text and "curl -sS" not in text
        assert "--verbose also prints the" in text

        # And a second `up` in the same checkout refuses at once, naming the first
        second = subprocess.run(
            [sys.executable, "-m", "devstack", "up", "--port", "0", "--template", str(mini_template)],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
        )  # fmt: skip
        assert second.returncode == 1, second.stdout + second.stderr
        assert f"another `make up` is running in this checkout (pid {process.pid}, API {api_url}" in second.stdout

        # And its HTTP API answers
        with urllib.request.urlopen(f"{api_url}/nowhere-{os.getpid()}", timeout=10) as response:
            pytest.fail(f"expected 404, got {response.status}")
    except urllib.error.HTTPError as error:
        assert error.code == 404
        assert json.loads(error.read()) == {"message": "Not Found"}
    finally:
        # And Ctrl-C stops it cleanly
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=60)
        reader.join(10)
    while not lines.empty():
        output.append(lines.get())
    assert code == 0, "".join(output)
    assert output[-1].strip() == "stopped"
    assert sum("token=" in line for line in output) == 1  # printed once; the console logs no request line


def test_up_serves_the_sample_services_unless_the_template_cannot_or_the_caller_named_services(
    mini_template: Path,
) -> None:
    real = Stack.from_file(REPO_ROOT / "template.yaml")
    assert devstack.cli._serves_sample_services(real, {})
    assert devstack.cli._serves_sample_services(real, {"LogLevel": "DEBUG"})
    assert not devstack.cli._serves_sample_services(real, {"FlightsBaseUrl": "http://127.0.0.1:9"})
    assert not devstack.cli._serves_sample_services(real, {"DeploySampleServices": "true"})
    assert not devstack.cli._serves_sample_services(Stack.from_file(mini_template), {})
