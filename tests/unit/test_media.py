"""The media store (content-addressed, bounded, verified) and the producer's media thread."""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest
from PIL import Image

from metricbus.producers import Run
from metricbus.producers._media import MediaWriter
from metricbus.producers._spool import Spool
from metricbus.schemas import (
    MEDIA,
    MediaMissing,
    MediaRefused,
    MediaStore,
    Settings,
    decode_events,
    default_codec,
    digest_of,
    ref_of,
)


def test_the_store_keeps_bytes_by_content_and_gives_them_back_verified(tmp_path):
    store = MediaStore(tmp_path / "media")
    digest = store.put(b"picture")
    assert digest == digest_of(b"picture") and store.put(b"picture") == digest  # kept once
    assert store.get(ref_of(digest), size=7) == b"picture"
    assert list(store.digests()) == [digest] and store.used_bytes() == 7
    store.path(digest).write_bytes(b"pictura")  # corrupted on disk
    with pytest.raises(MediaMissing, match="does not match its digest"):
        store.get(ref_of(digest))
    with pytest.raises(MediaMissing, match="not in the store"):
        store.get(ref_of("0" * 64))
    assert store.remove(digest) == 7 and store.used_bytes() == 0


@pytest.mark.parametrize(
    "ref", ["../../etc/passwd", "sha256/../../../etc/passwd", "sha256/" + "A" * 64, "", "md5/x"]
)
def test_a_reference_from_a_topic_is_never_a_path(tmp_path, ref):
    (tmp_path / "secret").write_bytes(b"x")
    with pytest.raises(MediaMissing, match="is not sha256/<64 hex digits>"):
        MediaStore(tmp_path / "media").get(ref)


def test_the_store_refuses_past_its_bounds_and_says_which(tmp_path):
    store = MediaStore(tmp_path / "media", max_bytes=10, max_item_bytes=8)
    with pytest.raises(MediaRefused, match="9 bytes is over the 8-byte limit of one item"):
        store.put(b"123456789")
    store.put(b"12345678")
    with pytest.raises(MediaRefused, match="holds 8 bytes, its limit is 10: raise METRICBUS_MEDIA_MAX_MB"):
        store.put(b"abc")
    assert MediaStore(tmp_path / "media").used_bytes() == 8  # counted from the disk by a new process


def _offline(tmp_path, **kw) -> Run:
    return Run("p", settings=Settings(data_dir=tmp_path, offline=True, **kw), system_metrics=False)


def _media_events(run: Run) -> list:
    """The Media events an offline run kept in its spool, as `metricbus sync` would send them."""
    codec = default_codec()
    records = [r for r, _ in Spool(run.spool_path).read_unsent(10_000, start=0)]
    return [e for r in records for e in decode_events(codec, r) if e.kind == MEDIA]


def test_arrays_of_every_layout_become_the_image_that_was_meant(tmp_path):
    run = _offline(tmp_path)
    rgb = np.random.default_rng(1).integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    run.log_image("hwc", rgb, step=1)
    run.log_image("chw floats", np.moveaxis(rgb, -1, 0) / 255.0, step=2)
    run.log_image("grey", rgb[:, :, 0], step=3)
    run.log_image("file", _png_file(tmp_path, rgb), step=4)
    run.finish()
    store = MediaStore.of(run.settings)
    got = {
        e.body["name"]: np.asarray(Image.open(io.BytesIO(store.get(e.body["ref"]))))
        for e in _media_events(run)
    }
    assert np.array_equal(got["hwc"], rgb) and np.array_equal(got["file"], rgb)
    assert np.abs(got["chw floats"].astype(int) - rgb).max() <= 1
    assert np.array_equal(got["grey"], rgb[:, :, 0])


def _png_file(tmp_path, rgb):
    path = tmp_path / "in.png"
    Image.fromarray(rgb).save(path)
    return path


def test_a_bad_item_or_a_full_store_is_said_and_counted_and_scalars_go_on(tmp_path, caplog):
    run = _offline(tmp_path, media_max_mb=0.001)  # about 1 kB
    run.log_image("bad", np.zeros(5), step=0)  # no image: said once, never raised
    run.log_image("big", np.random.default_rng(2).integers(0, 256, size=(64, 64, 3), dtype=np.uint8))
    run.log_text("small", "fits", step=0)
    run.log({"loss": 1.0}, step=0)
    run.finish()
    stats = run.stats()
    assert stats["skipped_calls"] == 1 and stats["media_refused"] == 1 and stats["media_logged"] == 1
    assert [e.body["name"] for e in _media_events(run)] == ["small"]
    said = caplog.text
    assert "an image is HxW, HxWxC or CxHxW (got shape (5,))" in said
    assert "its limit is 1,048" in said and "METRICBUS_MEDIA_MAX_MB" in said


def test_the_media_thread_sheds_past_its_queue_and_counts(tmp_path):
    release = threading.Event()

    class SlowStore(MediaStore):
        def put(self, data):
            release.wait(10)
            return super().put(data)

    emitted = []
    writer = MediaWriter(SlowStore(tmp_path), emitted.append, lambda what, exc: None, max_items=1)
    fields = {"step": 0, "name": "t", "rank": 0, "kind": "text", "caption": None}
    writer.submit(fields, "first", 5)
    deadline = time.monotonic() + 10
    while not writer._busy and time.monotonic() < deadline:
        time.sleep(0.01)
    writer.submit(fields, "second", 6)  # waits in the queue
    writer.submit(fields, "third", 5)  # the queue is full: shed
    release.set()
    assert writer.drain(10)
    assert writer.dropped == 1 and writer.logged == 2
    assert [e["size"] for e in emitted] == [5, 6]


def test_the_wandb_drop_ins_media_objects_become_metricbus_media(tmp_path):
    import metricbus.wandb as wandb

    settings = Settings(data_dir=tmp_path, offline=True)
    run = wandb.init(project="p", settings=settings, system_metrics=False)
    rgb = np.random.default_rng(4).integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    wandb.log(
        {
            "pred": wandb.Image(rgb, caption="a cat"),
            "episode": wandb.Video(np.zeros((5, 3, 8, 8), np.uint8), fps=8),  # wandb's TxCxHxW
            "speech": wandb.Audio(np.zeros(800), sample_rate=8000),
            "page": wandb.Html("<b>bold</b>"),
            "gallery": [wandb.Image(rgb), wandb.Image(rgb[::-1])],
            "loss": 0.5,
        }
    )
    wandb.finish()
    media = {e.body["name"]: e.body for e in _media_events(run.metricbus_run)}
    assert sorted(media) == ["episode", "gallery/0", "gallery/1", "page", "pred", "speech"]
    assert all(b["step"] == 0 for b in media.values())
    assert media["pred"]["caption"] == "a cat" and (media["pred"]["width"], media["pred"]["height"]) == (8, 6)
    assert (media["episode"]["frames"], media["episode"]["rate"], media["episode"]["width"]) == (5, 8.0, 8)
    assert (media["speech"]["rate"], media["speech"]["frames"]) == (8000.0, 800)
    store = MediaStore.of(settings)
    assert store.get(media["page"]["ref"]) == b"<b>bold</b>"  # kept as text, shown as text
    assert run.unsupported == {}


def test_gc_deletes_only_old_items_no_archived_or_spooled_event_names(tmp_path):
    import os
    import subprocess
    import sys

    from metricbus.sinks.parquet import ParquetArchive

    run = _offline(tmp_path)
    run.log_text("spooled", "in the spool only", step=0)
    run.log_text("archived", "in the archive", step=1)
    run.finish()
    events = _media_events(run)
    archive = ParquetArchive(run.settings.archive_dir)
    archive.open()
    archive.write([e for e in decode_all(run) if e.kind != MEDIA or e.body["name"] == "archived"])
    archive.flush()
    store = MediaStore.of(run.settings)
    orphan, young = store.put(b"nobody names me"), store.put(b"nor me, but I am new")
    hour_ago = time.time() - 7200
    for digest in [orphan, *(e.body["digest"] for e in events)]:
        os.utime(store.path(digest), (hour_ago, hour_ago))

    def gc(*args):
        done = subprocess.run(
            [sys.executable, "-m", "metricbus", "--data-dir", str(tmp_path), "gc", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "would delete 1 item(s)" in gc("--dry-run") and len(list(store.digests())) == 4
    out = gc()
    assert "deleted 1 item(s) no event references (15 bytes); kept 3 (2 referenced" in out
    assert sorted(store.digests()) == sorted([young, *(e.body["digest"] for e in events)])
    for spool in (run.settings.spool_dir).rglob("*.spool"):  # the spooled event sent and gone
        spool.unlink()
    assert "deleted 1 item(s)" in gc()  # the spooled-only item: no event names it any more
    assert sorted(store.digests()) == sorted(
        [young, next(e.body["digest"] for e in events if e.body["name"] == "archived")]
    )


def decode_all(run: Run) -> list:
    codec = default_codec()
    return [e for r, _ in Spool(run.spool_path).read_unsent(10_000, start=0) for e in decode_events(codec, r)]


@pytest.mark.frameworks
def test_the_lightning_logger_takes_wandb_loggers_media_calls(tmp_path):
    pytest.importorskip("lightning", reason="Lightning is an optional extra; `make test` installs it")
    from metricbus.lightning import MetricbusLogger

    logger = MetricbusLogger(
        project="p", settings=Settings(data_dir=tmp_path, offline=True), system_metrics=False
    )
    rgb = np.zeros((4, 4, 3), np.uint8)
    logger.log_image("samples", [rgb, rgb + 9], step=3, caption=["first", "second"])
    logger.log_audio("clip", [np.zeros(100)], step=3, sample_rate=[8000])
    logger.log_text("completion", "hello", step=4)
    logger.finalize("success")
    got = {e.body["name"]: e.body for e in _media_events(logger.experiment)}
    assert sorted(got) == ["clip", "completion", "samples/0", "samples/1"]
    assert got["samples/1"]["caption"] == "second" and got["samples/0"]["step"] == 3
    assert got["clip"]["rate"] == 8000.0 and got["completion"]["step"] == 4


def test_the_media_store_may_live_apart_from_the_data_directory(tmp_path):
    """METRICBUS_MEDIA_DIR: a shared volume for the media of training jobs on other machines;
    the spool stays in the (local) data directory."""
    shared = tmp_path / "shared"
    run = Run(
        "p",
        settings=Settings(data_dir=tmp_path / "local", offline=True, media_dir=shared),
        system_metrics=False,
    )
    run.log_text("note", "kept on the shared volume", step=0)
    run.finish()
    (event,) = _media_events(run)
    assert MediaStore(shared).get(event.body["ref"]) == b"kept on the shared volume"
    assert not (tmp_path / "local" / "media").exists() and run.spool_path.is_relative_to(tmp_path / "local")


def test_an_array_past_the_queues_bound_is_shed_before_it_is_copied(tmp_path, monkeypatch):
    import metricbus.producers._run as run_module

    run = _offline(tmp_path)
    run.log_text("first", "makes the media thread", step=0)
    run._media.max_bytes = 10_000  # the queue's bound in bytes (256 MB by default)
    copied = []
    real = run_module.copy_for_later
    monkeypatch.setattr(
        run_module, "copy_for_later", lambda kind, data: copied.append(kind) or real(kind, data)
    )
    run.log_image("big", np.zeros((64, 64, 3), np.uint8), step=1)  # 12,288 bytes
    run.log_image("small", np.zeros((8, 8, 3), np.uint8), step=1)
    run.finish()
    assert run.stats()["media_dropped"] == 1 and copied == ["image"]  # the small one only
    assert [e.body["name"] for e in _media_events(run)] == ["first", "small"]


def test_a_figure_is_rendered_once_in_the_caller_and_kept_as_the_png_it_drew(tmp_path):
    """Anything with matplotlib's ``savefig`` (SummaryWriter.add_figure, SB3's Figure): drawn at the
    call, so what the caller draws next is not in what was logged."""

    class Figure:  # matplotlib's interface, without matplotlib (not a dependency)
        def __init__(self):
            self.colour, self.saved = (200, 0, 0), 0

        def savefig(self, out, format):  # noqa: A002 - matplotlib's keyword
            self.saved += 1
            Image.fromarray(np.full((5, 8, 3), self.colour, np.uint8)).save(out, format=format)

    run = _offline(tmp_path)
    figure = Figure()
    run.log_image("curve", figure, step=0)
    figure.colour = (0, 0, 200)  # drawn on after the call
    run.finish()
    (event,) = _media_events(run)
    logged = np.asarray(Image.open(io.BytesIO(MediaStore.of(run.settings).get(event.body["ref"]))))
    assert figure.saved == 1 and (event.body["width"], event.body["height"]) == (8, 5)
    assert tuple(logged[0, 0]) == (200, 0, 0)
