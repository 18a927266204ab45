"""The containers: `docker compose` builds the image, starts the translator and Prometheus, a translation
goes through the published port and Prometheus scrapes the translator. Also the lint checks of the
Dockerfile (hadolint), the compose files (`docker compose config`), the Prometheus files (promtool) and
the metric names that the dashboard and the rules use, against a live /metrics.

The stack tests need a Docker engine with Compose v2 and skip without one; .ci/run starts one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_GPU = ROOT / "docker-compose.gpu.yml"
DOCKER_DIR = ROOT / "docker"
DASHBOARD = DOCKER_DIR / "grafana" / "dashboards" / "translator.json"
RULES = DOCKER_DIR / "rules.yml"
IMAGE = "transformer-mt-server:test"  # never the developer's :latest
PROMETHEUS_IMAGE = "prom/prometheus:latest"
IMAGE_SIZE_TARGET_MB = 600  # 587 MB on 2026-12-06: the default model 101 MB, lingua's language models 96 MB
# variables that steer docker-compose.yml: the test sets its own and takes none from the caller
STEERING_PREFIXES = ("MT_", "COMPOSE_", "PROMETHEUS_", "GRAFANA_")
METRIC = re.compile(r"(?<![\w:])mt_[a-z0-9_]+(?![\w:])")  # a metric name, not part of a recorded name
RECORDED = re.compile(r"(?<![\w:])[a-z_]+:mt_[a-z0-9_:]+")


# -- helpers --------------------------------------------------------------------------------------


def run(args: list[str], timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def docker_missing() -> str | None:
    """Why the stack tests cannot run here, or None when a Docker engine and Compose v2 answer."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    try:
        info = run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=20)
        compose = run(["docker", "compose", "version"], timeout=20)
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer `docker info` within 20 s"
    if info.returncode != 0:
        return f"no Docker engine answers ({(info.stderr.strip().splitlines() or ['docker info failed'])[-1]})"
    if compose.returncode != 0:
        return "no Docker Compose v2 (`docker compose version` failed)"
    return None


def compose_cli_missing() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    if run(["docker", "compose", "version"], timeout=20).returncode != 0:
        return "no Docker Compose v2 (`docker compose version` failed)"
    return None


def linter(name: str) -> str | None:
    """A linter on PATH or where `docker-local.sh tools` installs them."""
    state = Path(os.environ.get("DOCKER_LOCAL_STATE", "/var/tmp/docker-local"))
    return shutil.which(name) or shutil.which(name, path=str(state / "tools-venv" / "bin"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def post_json(url: str, body: dict[str, object], timeout: float = 60) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def exported_names(exposition: str) -> set[str]:
    """Every series name a /metrics text can carry: its samples', and each family's (from `# TYPE`) with
    its type's suffixes, so that families without samples yet (no errors so far) count too."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            base = family.removesuffix("_total") if kind == "counter" else family
            names.update(base + suffix for suffix in suffixes.get(kind, ("",)))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


# -- the stack ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    compose: list[str]  # `docker compose` with this test's project, files and env file
    env: dict[str, str]
    translator: str  # base URLs on the published ports
    prometheus: str


def compose_step(stack: Stack, args: list[str], what: str, timeout: float) -> None:
    result = run(stack.compose + args, timeout=timeout, env=stack.env)
    if result.returncode != 0:
        logs = run(stack.compose + ["logs", "--no-color", "--tail", "40"], env=stack.env).stdout
        state = run(stack.compose + ["ps", "-a"], env=stack.env).stdout
        pytest.fail(
            f"`docker compose {' '.join(args)}` could not {what} (exit {result.returncode}):\n"
            f"{tail(result.stderr)}\n--- docker compose ps -a:\n{state}\n--- logs:\n{tail(logs, 80)}"
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Builds the image and starts docker-compose.yml as its own project on free ports; always takes it
    down (volumes too), whatever happened."""
    reason = docker_missing()
    if reason:
        pytest.skip(f"container tests need a Docker engine with Compose v2: {reason}")
    translator_port, prometheus_port = free_port(), free_port()
    env_file = tmp_path_factory.mktemp("compose") / "test.env"  # instead of a developer's .env
    env_file.write_text(f"MT_PORT={translator_port}\nPROMETHEUS_PORT={prometheus_port}\nMT_IMAGE={IMAGE}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(STEERING_PREFIXES)}
    project = f"mt-test-{os.getpid()}"
    command = ["docker", "compose", "--project-name", project, "--project-directory", str(ROOT)]
    command += ["--file", str(COMPOSE), "--env-file", str(env_file)]  # no docker-compose.override.yml
    started = Stack(command, env, f"http://127.0.0.1:{translator_port}", f"http://127.0.0.1:{prometheus_port}")
    try:
        compose_step(started, ["build", "translator"], "build the image", timeout=1200)
        compose_step(started, ["up", "--detach", "--wait", "--wait-timeout", "240"], "start the stack", timeout=300)
        yield started
    finally:
        down = run(command + ["down", "--volumes", "--remove-orphans", "--timeout", "20"], timeout=180, env=env)
        assert down.returncode == 0, f"docker compose down failed:\n{tail(down.stderr)}"


def poll(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Calls check() until it returns something truthy; fails with `what` and the last value after timeout."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (urllib.error.URLError, OSError, KeyError, ValueError) as error:
            last = error
        else:
            if last:
                return last
        time.sleep(1)
    pytest.fail(f"{what} within {timeout:.0f} s; last seen: {last!r}")


@pytest.mark.timeout(1500)
def test_translate_through_the_published_port(stack: Stack) -> None:
    status, body = post_json(f"{stack.translator}/translate", {"q": "Open the file.", "source": "en", "target": "fr"})
    assert status == 200, f"POST /translate answered {status}: {body}"
    assert isinstance(body["translatedText"], str) and body["translatedText"].strip(), f"empty translation: {body}"
    assert get_json(f"{stack.translator}/ready")["status"] == "ready"


@pytest.mark.timeout(1500)
def test_prometheus_scrapes_the_translator(stack: Stack) -> None:
    def translator_target() -> list[dict[str, Any]]:
        targets = get_json(f"{stack.prometheus}/api/v1/targets")["data"]["activeTargets"]
        return [t for t in targets if t["labels"]["job"] == "translator" and t["health"] == "up"]

    poll(translator_target, 90, "Prometheus did not see the translator's target up")
    query = f"{stack.prometheus}/api/v1/query?query=mt_http_requests_total"
    series = poll(lambda: get_json(query)["data"]["result"], 60, "mt_http_requests_total had no series")
    assert {s["metric"]["job"] for s in series} == {"translator"}, series
    groups = get_json(f"{stack.prometheus}/api/v1/rules")["data"]["groups"]
    assert {g["name"] for g in groups} == {"translator.recording", "translator.alerts"}, groups
    broken = [r for g in groups for r in g["rules"] if r.get("health") == "err"]  # "unknown" until evaluated
    assert not broken, f"rules that Prometheus cannot evaluate: {broken}"


@pytest.mark.timeout(1500)
def test_the_server_runs_as_a_user_on_a_read_only_root_without_torch(stack: Stack) -> None:
    probe = "import importlib.util, os; print(os.getuid(), importlib.util.find_spec('torch') is None)"
    result = run(stack.compose + ["exec", "-T", "translator", "python", "-c", probe], env=stack.env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["10001", "True"], f"uid and torch-free expected, got {result.stdout!r}"
    container = run(stack.compose + ["ps", "--quiet", "translator"], env=stack.env).stdout.strip()
    read_only = run(["docker", "inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", container]).stdout.strip()
    assert read_only == "true", f"the translator's root filesystem is not read-only ({read_only!r})"
    host = json.loads(run(["docker", "inspect", "--format", "{{json .HostConfig}}", container]).stdout)
    capabilities = f"capabilities: drop {host['CapDrop']}, add {host['CapAdd']}"
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"], capabilities
    assert "no-new-privileges:true" in (host["SecurityOpt"] or []), f"security options: {host['SecurityOpt']}"
    assert not host["Privileged"], "the translator runs privileged"


@pytest.mark.timeout(1500)
def test_the_image_is_under_its_size_target(stack: Stack) -> None:
    size = int(run(["docker", "image", "inspect", "--format", "{{.Size}}", IMAGE]).stdout.strip())
    assert size < IMAGE_SIZE_TARGET_MB * 10**6, f"{IMAGE} is {size / 10**6:.0f} MB; target {IMAGE_SIZE_TARGET_MB} MB"


# -- lint checks ----------------------------------------------------------------------------------


def test_hadolint_reports_nothing_on_the_dockerfile() -> None:
    hadolint = linter("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (`docker-local.sh tools` installs it)")
    result = run([hadolint, "Dockerfile"])
    assert result.returncode == 0 and not result.stdout.strip(), f"hadolint:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize(
    "options",
    [[], ["--file", "docker-compose.yml", "--file", "docker-compose.gpu.yml"], ["--profile", "grafana"]],
    ids=["default", "gpu", "grafana"],
)
def test_compose_config_is_valid(options: list[str]) -> None:
    reason = compose_cli_missing()
    if reason:
        pytest.skip(reason)
    files = options if "--file" in options else ["--file", "docker-compose.yml", *options]
    result = run(["docker", "compose", "--env-file", os.devnull, *files, "config", "--quiet"])
    assert result.returncode == 0, f"docker compose {' '.join(files)} config:\n{result.stderr}"


def test_compose_passes_every_setting_through() -> None:
    passed = set(re.findall(r"^\s*- (MT_[A-Z_]+)", COMPOSE.read_text(encoding="utf-8"), re.MULTILINE))
    missing = {f"MT_{name.upper()}" for name in Settings.model_fields} - passed
    assert not missing, f"docker-compose.yml does not pass these settings to the translator: {sorted(missing)}"


def promtool() -> list[str]:
    """promtool on PATH, else the one inside the prom/prometheus image (with docker/ mounted at /cfg)."""
    if local := shutil.which("promtool"):
        return [local]
    reason = docker_missing()
    if reason:
        pytest.skip(f"no promtool on PATH and no Docker engine to run {PROMETHEUS_IMAGE}'s: {reason}")
    if run(["docker", "image", "inspect", PROMETHEUS_IMAGE]).returncode != 0:
        pytest.skip(f"no promtool on PATH and no {PROMETHEUS_IMAGE} image (`docker-local.sh standins` makes one)")
    return ["docker", "run", "--rm", "--entrypoint", "promtool", "-v", f"{DOCKER_DIR}:/cfg:ro", PROMETHEUS_IMAGE]


def test_promtool_accepts_the_config_and_the_rules() -> None:
    tool = promtool()
    local = len(tool) == 1
    where = DOCKER_DIR if local else Path("/cfg")
    if local:  # prometheus.yml names the rules at the path compose mounts them; check the config's own syntax
        checks = [["check", "config", "--syntax-only", str(where / "prometheus.yml")]]
    else:  # inside the image the rules can sit where prometheus.yml expects them
        tool = tool[:-1] + ["-v", f"{RULES}:/etc/prometheus/rules.yml:ro", tool[-1]]
        checks = [["check", "config", str(where / "prometheus.yml")]]
    checks += [["check", "rules", str(where / "rules.yml")]]
    for check in checks:
        result = run(tool + check)
        assert result.returncode == 0, f"promtool {' '.join(check)}:\n{result.stdout}{result.stderr}"
    tests = run(tool + ["test", "rules", str(where / "rules.test.yml")])
    assert tests.returncode == 0, f"promtool test rules:\n{tests.stdout}{tests.stderr}"


@pytest.fixture(scope="module")
def live_metric_names(model_dir: Path) -> set[str]:
    """The names a running server's /metrics exports, after one translation."""
    settings = Settings(models_dir=model_dir.parent, models=[model_dir.name], intra_op_threads=1)
    with TestClient(create_app(settings)) as client:
        response = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "fr"})
        assert response.status_code == 200, response.text
        return exported_names(client.get("/metrics").text)


def test_the_dashboard_queries_only_exported_metrics(live_metric_names: set[str]) -> None:
    queries = dashboard_queries()  # the file must be valid JSON with panels and targets
    used = {name for query in queries for name in METRIC.findall(query)}
    assert {"mt_decoder_step_rows_bucket", "mt_generated_tokens_total", "mt_queue_depth"} <= used, sorted(used)
    unknown = used - live_metric_names
    assert not unknown, f"{DASHBOARD.name} queries metrics the server does not export: {sorted(unknown)}"


def test_the_rules_use_only_exported_metrics_and_their_own_records(live_metric_names: set[str]) -> None:
    text = RULES.read_text(encoding="utf-8")
    unknown = set(METRIC.findall(text)) - live_metric_names - {"up"}
    assert not unknown, f"{RULES.name} names metrics the server does not export: {sorted(unknown)}"
    recorded = set(re.findall(r"record:\s*(\S+)", text))
    undefined = set(RECORDED.findall(text)) - recorded
    assert not undefined, f"{RULES.name} uses recording rules it does not define: {sorted(undefined)}"


def test_the_gpu_override_runs_fp32_on_cuda_first() -> None:
    """The variant whose products all run on the GPU; fp16 is refused on CUDA (docs/performance.md "GPU")."""
    reason = compose_cli_missing()
    if reason:
        pytest.skip(reason)
    files = ["--file", "docker-compose.yml", "--file", "docker-compose.gpu.yml"]
    result = run(["docker", "compose", "--env-file", os.devnull, *files, "config", "--format", "json"])
    assert result.returncode == 0, result.stderr
    environment = json.loads(result.stdout)["services"]["translator"]["environment"]
    assert environment["MT_VARIANT"] == "fp32" and environment["MT_PROVIDERS"] == "cuda,cpu"
