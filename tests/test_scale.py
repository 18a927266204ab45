"""Replicas behind HAProxy (docker-compose.scale.yml), live on the Docker engine: both replicas serve, Prometheus
finds both through Docker's DNS and scrapes the balancer, a replica killed under steady load costs no failed
request, and a restarted one is back in rotation. Skips without an engine, as tests/test_containers.py does;
.ci/run starts one.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.test_containers import (
    COMPOSE,
    DOCKER_DIR,
    IMAGE,
    ROOT,
    RULES,
    STEERING_PREFIXES,
    compose_cli_missing,
    dashboard_queries,
    docker_missing,
    free_port,
    get_json,
    linter,
    poll,
    promtool,
    run,
    tail,
)

HAPROXY_METRIC = re.compile(r"(?<![\w:])haproxy_[a-z0-9_]+")

COMPOSE_SCALE = ROOT / "docker-compose.scale.yml"
HAPROXY_DIR = DOCKER_DIR / "haproxy"
BALANCER_IMAGE = "transformer-mt-haproxy:test"
BODY = json.dumps({"q": ["Open the file.", "The weather is nice today."], "source": "en", "target": "fr"}).encode()


@dataclass(frozen=True)
class Scaled:
    compose: list[str]
    env: dict[str, str]
    balancer: str
    stats: str
    prometheus: str

    def translators(self) -> list[str]:
        result = run(self.compose + ["ps", "--quiet", "translator"], env=self.env)
        assert result.returncode == 0, result.stderr
        return sorted(result.stdout.split())


def step(stack: Scaled, args: list[str], what: str, timeout: float) -> None:
    result = run(stack.compose + args, timeout=timeout, env=stack.env)
    if result.returncode != 0:
        logs = run(stack.compose + ["logs", "--no-color", "--tail", "40"], env=stack.env).stdout
        pytest.fail(f"`docker compose {' '.join(args)}` could not {what}:\n{tail(result.stderr)}\n{tail(logs, 80)}")


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scaled]:
    reason = docker_missing()
    if reason:
        pytest.skip(f"container tests need a Docker engine with Compose v2: {reason}")
    port, stats, prometheus = free_port(), free_port(), free_port()
    env_file = tmp_path_factory.mktemp("compose-scale") / "test.env"
    env_file.write_text(
        f"MT_PORT={port}\nHAPROXY_STATS_PORT={stats}\nPROMETHEUS_PORT={prometheus}\nMT_IMAGE={IMAGE}\n"
        f"HAPROXY_IMAGE={BALANCER_IMAGE}\nMT_REPLICAS=2\nMT_CPUS=1\n"
        # a killed replica's slot is emptied when its name leaves the DNS; a short drain keeps `down` quick
        "MT_SHUTDOWN_GRACE_SECONDS=5\nMT_STOP_GRACE_PERIOD=15s\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith((*STEERING_PREFIXES, "HAPROXY_"))}
    project = f"mt-scale-test-{os.getpid()}"
    command = ["docker", "compose", "--project-name", project, "--project-directory", str(ROOT)]
    command += ["--file", str(COMPOSE), "--file", str(COMPOSE_SCALE), "--env-file", str(env_file)]
    started = Scaled(
        command, env, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{stats}", f"http://127.0.0.1:{prometheus}"
    )
    try:
        step(started, ["build", "translator", "balancer"], "build the images", timeout=1200)
        step(started, ["up", "--detach", "--wait", "--wait-timeout", "240"], "start the replicas", timeout=300)
        yield started
    finally:
        down = run(command + ["down", "--volumes", "--remove-orphans", "--timeout", "20"], timeout=180, env=env)
        assert down.returncode == 0, f"docker compose down failed:\n{tail(down.stderr)}"


def translate(base: str, timeout: float = 30) -> tuple[int, str]:
    """(status, the X-Served-By header); status 0 for a connection error."""
    request = urllib.request.Request(
        f"{base}/translate", data=BODY, headers={"content-type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            json.load(response)
            return response.status, response.headers.get("x-served-by", "")
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("x-served-by", "")
    except OSError:
        return 0, ""


@dataclass
class Load:
    """Closed-loop clients through the balancer, each sending its next request when the last is answered."""

    base: str
    clients: int = 4
    answers: list[tuple[float, int, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Load:
        self.threads = [threading.Thread(target=self.client, daemon=True) for _ in range(self.clients)]
        for thread in self.threads:
            thread.start()
        return self

    def client(self) -> None:
        while not self.stop.is_set():
            status, server = translate(self.base)
            self.answers.append((time.monotonic(), status, server))

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def since(self, moment: float) -> list[tuple[float, int, str]]:
        return [answer for answer in list(self.answers) if answer[0] >= moment]


def active_servers(stack: Scaled) -> int:
    with urllib.request.urlopen(f"{stack.stats}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith('haproxy_backend_active_servers{proxy="translators"}'):
                return int(float(line.split()[-1]))
    return 0


@pytest.mark.timeout(1500)
def test_both_replicas_serve_and_prometheus_finds_them(scaled: Scaled) -> None:
    assert len(scaled.translators()) == 2
    served = Counter(translate(scaled.balancer)[1] for _ in range(12))
    assert len(served) == 2 and "" not in served, f"answers by replica: {served}"
    assert min(served.values()) >= 3, f"leastconn should share sequential requests: {served}"

    def targets() -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for target in get_json(f"{scaled.prometheus}/api/v1/targets")["data"]["activeTargets"]:
            if target["health"] == "up":
                found.setdefault(target["labels"]["job"], set()).add(target["labels"]["instance"])
        return found if len(found.get("translator", ())) == 2 and found.get("balancer") else {}

    poll(targets, 90, "Prometheus did not find both replicas (DNS) and the balancer up")
    query = 'sum by (instance) (mt_http_requests_total{route="/translate"})'
    url = f"{scaled.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    poll(lambda: len(get_json(url)["data"]["result"]) == 2, 60, "Prometheus had no /translate counts of both replicas")


@pytest.mark.timeout(1500)
def test_a_replica_killed_under_load_costs_no_request_and_comes_back(scaled: Scaled) -> None:
    victim = scaled.translators()[0]
    with Load(scaled.balancer) as load:
        time.sleep(3)
        before = load.since(0)
        assert before and {status for _, status, _ in before} == {200}, Counter(s for _, s, _ in before)
        killed = time.monotonic()
        assert run(["docker", "kill", victim]).returncode == 0
        poll(lambda: active_servers(scaled) == 1, 30, "HAProxy did not take the killed replica out")
        time.sleep(3)  # the survivor alone, under the same load
        alone = time.monotonic()
        # a restart (`restart: unless-stopped` leaves a killed container stopped): back with a new address maybe
        restarted = run(["docker", "start", victim])
        assert restarted.returncode == 0, restarted.stderr
        poll(lambda: active_servers(scaled) == 2, 180, "the restarted replica was not back in rotation")
        back = time.monotonic()
        time.sleep(4)
    answers = load.answers
    failed = Counter(status for _, status, _ in answers if status != 200)
    if failed:
        logs = run(scaled.compose + ["logs", "--no-color", "balancer"], env=scaled.env).stdout.splitlines()
        errors = "\n".join(line for line in logs if " 200 " not in line)
        pytest.fail(f"{sum(failed.values())} of {len(answers)} requests failed around the kill: {failed}\n{errors}")
    during = load.since(killed)
    assert len(load.since(alone)) > 0 and len(during) > 20, f"too little load to tell: {len(during)} answers"
    after = {server for moment, _, server in answers if moment >= back}
    assert len(after) == 2, f"after the restart only {after} answered"


@pytest.mark.timeout(1500)
def test_a_replica_stopped_under_load_drains_without_a_failed_request(scaled: Scaled) -> None:
    """docker stop: SIGTERM, /ready answers 503, new requests go to the other replica (a 503 is retried), those in
    flight finish within MT_SHUTDOWN_GRACE_SECONDS (5 s here)."""
    victim = scaled.translators()[-1]
    with Load(scaled.balancer) as load:
        time.sleep(2)
        stopping = time.monotonic()
        stopped = run(["docker", "stop", "--time", "15", victim], timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        assert time.monotonic() - stopping < 12, "the replica took longer to drain than its grace allows"
        time.sleep(2)
        started = run(["docker", "start", victim])
        assert started.returncode == 0, started.stderr
        poll(lambda: active_servers(scaled) == 2, 180, "the restarted replica was not back in rotation")
        time.sleep(2)
    failed = Counter(status for _, status, _ in load.answers if status != 200)
    assert not failed, f"{sum(failed.values())} of {len(load.answers)} requests failed around the stop: {failed}"
    assert len(load.since(stopping)) > 20, "too little load to tell"


@pytest.mark.timeout(1500)
def test_the_dashboard_queries_only_metrics_the_balancer_exports(scaled: Scaled) -> None:
    used = {name for query in dashboard_queries() for name in HAPROXY_METRIC.findall(query)}
    assert "haproxy_backend_active_servers" in used, sorted(used)
    with urllib.request.urlopen(f"{scaled.stats}/metrics", timeout=10) as response:
        exported = {line.split("{")[0].split()[0] for line in response.read().decode().splitlines() if line[:1] != "#"}
    assert not used - exported, f"the dashboard queries what HAProxy does not export: {sorted(used - exported)}"


# -- lint checks of the files themselves (no stack) -----------------------------------------------------------


def test_the_scale_override_unpublishes_the_translators_and_publishes_the_balancer() -> None:
    reason = compose_cli_missing()
    if reason:
        pytest.skip(reason)
    files = ["--file", str(COMPOSE), "--file", str(COMPOSE_SCALE)]
    result = run(["docker", "compose", "--env-file", os.devnull, *files, "config", "--format", "json"])
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert not services["translator"].get("ports"), services["translator"].get("ports")
    assert services["translator"]["deploy"]["replicas"] == 2
    published = {(p["host_ip"], p["published"], p["target"]) for p in services["balancer"]["ports"]}
    assert ("127.0.0.1", "8000", 8000) in published, published
    assert services["balancer"]["depends_on"]["translator"]["condition"] == "service_healthy"
    assert services["prometheus"]["volumes"][0]["source"].endswith("prometheus.scale.yml")


def test_hadolint_reports_nothing_on_the_balancers_dockerfile() -> None:
    hadolint = linter("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (`docker-local.sh tools` installs it)")
    result = run([hadolint, str(HAPROXY_DIR / "Dockerfile")])
    assert result.returncode == 0 and not result.stdout.strip(), f"hadolint:\n{result.stdout}{result.stderr}"


def test_promtool_accepts_the_scale_config() -> None:
    tool = promtool()
    if len(tool) == 1:
        check = [*tool, "check", "config", "--syntax-only", str(DOCKER_DIR / "prometheus.scale.yml")]
    else:
        check = [*tool[:-1], "-v", f"{RULES}:/etc/prometheus/rules.yml:ro", tool[-1]]
        check += ["check", "config", "/cfg/prometheus.scale.yml"]
    result = run(check)
    assert result.returncode == 0, f"promtool check config:\n{result.stdout}{result.stderr}"


def test_haproxy_accepts_its_config() -> None:
    """haproxy -c in the balancer's image, as docker compose runs it (the slots' variable set)."""
    reason = docker_missing()
    if reason:
        pytest.skip(reason)
    if run(["docker", "image", "inspect", BALANCER_IMAGE]).returncode != 0:
        pytest.skip(f"no {BALANCER_IMAGE} image (the stack tests above build it)")
    command = ["docker", "run", "--rm", "-e", "HAPROXY_SERVER_SLOTS=4", "-v", f"{HAPROXY_DIR}/haproxy.cfg:/cfg:ro"]
    result = run([*command, BALANCER_IMAGE, "haproxy", "-c", "-f", "/cfg"])
    assert result.returncode == 0, f"haproxy -c:\n{result.stdout}{result.stderr}"
