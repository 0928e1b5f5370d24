"""Signed events records (schemas/_signing.py): what the check refuses, and what reads them anyway."""

import dataclasses

import pytest

from metricbus.schemas import (
    RUN_STARTED,
    ForgedSignatureError,
    Settings,
    Signer,
    default_codec,
    encode_events,
    run_started,
)

KEY = "the project's secret"


@pytest.fixture
def plain() -> bytes:
    return encode_events(default_codec(), "r", "prod", [(0, 1, RUN_STARTED, run_started("p", "n"))])


def test_a_signed_record_passes_and_reads_as_the_record_it_wraps(plain):
    signed = Signer(KEY).sign(plain)
    Signer(KEY).check(signed)
    assert signed.endswith(plain) and default_codec().decode(signed) == default_codec().decode(plain)


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda s, p: p, "an unsigned record"),
        (lambda s, p: Signer("a guess").sign(p), "does not match"),
        (lambda s, p: s[:-1] + bytes([s[-1] ^ 1]), "does not match"),  # one bit of the record
        (lambda s, p: s[:10] + bytes([s[10] ^ 1]) + s[11:], "does not match"),  # one of the HMAC
        (lambda s, p: s[:20], "an unsigned record"),  # cut inside the signature
    ],
)
def test_the_check_refuses_a_record_without_the_keys_hmac(plain, damage, why):
    signed = Signer(KEY).sign(plain)
    with pytest.raises(ForgedSignatureError, match=why):
        Signer(KEY).check(damage(signed, plain))


def test_without_a_key_nothing_is_signed_nor_checked_and_the_key_is_never_shown(plain):
    keyless = Signer(None)
    assert not keyless.active and keyless.sign(plain) == plain
    keyless.check(plain)
    keyless.check(Signer(KEY).sign(plain))
    settings = Settings(signing_key=KEY)
    assert settings.signer.active and not dataclasses.replace(settings, signing_key=None).signer.active
    assert KEY not in repr(settings)
    assert Settings.from_env({"METRICBUS_SIGNING_KEY": KEY}, discover=False).signing_key == KEY
