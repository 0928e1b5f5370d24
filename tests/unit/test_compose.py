from pathlib import Path

import yaml

from metricbus._cli import build_parser
from metricbus._stack import CONSUMERS

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
    commands = {tuple(s["command"][:2]) for s in load()["services"].values() if "command" in s}
    for argv in CONSUMERS.values():
        assert tuple(argv[:2]) in commands
