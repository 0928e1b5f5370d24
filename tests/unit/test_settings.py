from pathlib import Path

import pytest

from metricbus.schemas import ConfigError, InvalidNameError, Settings, check_run_id, path_segment


def test_from_env_parses_types_and_overrides_win(tmp_path):
    env = {
        "METRICBUS_BOOTSTRAP": "k1:9092,k2:9092",
        "METRICBUS_PARTITIONS": "12",
        "METRICBUS_OFFLINE": "true",
        "METRICBUS_DATA_DIR": str(tmp_path),
        "METRICBUS_TOPIC_PREFIX": "team.",
    }
    s = Settings.from_env(env, topic_prefix="other.")
    assert s.bootstrap_servers == "k1:9092,k2:9092" and not s.is_local
    assert s.partitions == 12 and s.offline is True and s.data_dir == Path(tmp_path)
    assert s.topics.events == "other.events" and s.topics.deadletter == "other.deadletter"
    assert Settings.from_env(s.to_env()) == s


def test_local_by_default():
    s = Settings.from_env({})
    assert s.is_local and s.bootstrap_servers == "127.0.0.1:9092"


def test_secrets_never_show_in_repr():
    s = Settings(
        bootstrap="k:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="svc",
        sasl_password="hunter2",
    )
    assert "hunter2" not in repr(s) and "svc" in repr(s)


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"METRICBUS_PARTITIONS": "many"}, "METRICBUS_PARTITIONS='many' is not an integer"),
        ({"METRICBUS_OFFLINE": "maybe"}, "true/false"),
        ({"METRICBUS_SECURITY_PROTOCOL": "TLS"}, "SASL_SSL"),
        ({"METRICBUS_SECURITY_PROTOCOL": "SASL_SSL"}, "METRICBUS_SASL_MECHANISM"),
        ({"METRICBUS_LOCAL_PORT": "70000"}, "not a TCP port"),
        (
            {"METRICBUS_COMPRESSION": "snappy"},
            "METRICBUS_COMPRESSION='snappy' is not one of zstd, gzip, none",
        ),
    ],
)
def test_bad_settings_name_the_variable_and_the_fix(env, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env(env)


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "x" * 129, "sp ace"])
def test_unsafe_run_ids_are_refused(bad):
    with pytest.raises(InvalidNameError):
        check_run_id(bad)


def test_path_segments_are_safe_and_deterministic():
    assert path_segment("my project/v2") == "my project%2Fv2"
    assert path_segment("..") == "%2E%2E" and path_segment(".") == "%2E"
    assert path_segment("grpo-gemma") == "grpo-gemma"


def test_training_jobs_compress_with_zstd_unless_told_otherwise():
    assert Settings().compression == "zstd"
    assert Settings.from_env({"METRICBUS_COMPRESSION": "none"}).compression == "none"
    # kafka-python and aiokafka both need their codec library installed for zstd batches
    import cramjam  # noqa: F401  (aiokafka: every consumer reads them)
    from kafka.codec import has_zstd

    assert has_zstd()
