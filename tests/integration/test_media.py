"""Media logged in a training loop reach every sink by reference, read back with each sink's users' tools.

One run logs scalars, an image, a video, an audio clip and a text sample through the real broker;
the archive, TensorBoard and W&B sinks run as `metricbus sink` processes. TensorBoard's own
EventAccumulator decodes the pixels and samples, W&B's offline run file names the media files it
copied, the archive holds Media rows whose reference the store answers, and a replay into a new
TensorBoard directory gives what live gave.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import textwrap
import time
import wave

import numpy as np
import pytest
from PIL import Image

from metricbus.producers import Run
from metricbus.schemas import MEDIA, MediaStore
from metricbus.sinks import read_events, read_table

from .conftest import CHROMIUM, cli, get
from .test_tensorboard_replay import start_sink

pytestmark = pytest.mark.integration

RNG = np.random.default_rng(7)
PICTURE = RNG.integers(0, 256, size=(64, 48, 3), dtype=np.uint8)
FRAMES = RNG.integers(0, 256, size=(6, 16, 16, 3), dtype=np.uint8)
TONE = np.sin(np.linspace(0, 200 * np.pi, 1600))  # 0.1 s at 16 kHz
TEXT = "The answer is <b>42</b>\nsecond line, unicode: é"


def tb_media(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"images": 0, "audio": 0, "tensors": 0, "scalars": 0})
    acc.Reload()
    return acc


def test_media_reach_every_sink_and_a_replay(settings, tmp_path):
    pytest.importorskip("wandb", reason="wandb is an optional extra; `make test` installs it")
    from tests.wandb_reader import read_run, run_file

    env = {**os.environ, **settings.to_env(), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    live, wb_root = tmp_path / "tb", tmp_path / "wandb"
    procs = [
        start_sink(settings, "parquet", settings.archive_dir, env),
        start_sink(settings, "tensorboard", live, env),
        start_sink(settings, "wandb", wb_root, env),
    ]
    try:
        run = Run("vision", name="media", settings=settings, system_metrics=False)
        for step in range(10):
            run.log({"loss": 1.0 / (step + 1)}, step=step)
        run.log_image("samples/grid", PICTURE, step=3, caption="first batch")
        run.log_video("episode/video", FRAMES, fps=10, step=5)
        run.log_audio("speech", TONE, rate=16000, step=7)
        run.log_text("completion", TEXT, step=9)
        run.log_image("samples/grid", PICTURE[::-1], step=8)
        assert run.finish(timeout=30)
        assert run.stats()["media_logged"] == 5
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            kinds = read_table(settings.archive_dir, run.run_id, columns=["kind"])["kind"].to_pylist()
            dirs = list(live.glob(f"vision/media-{run.run_id}"))
            acc = tb_media(dirs[0]) if dirs else None
            if kinds.count(MEDIA) == 5 and acc is not None and len(acc.Tags()["images"]) == 2:
                if len(acc.Images("samples/grid")) == 2 and acc.Tags()["audio"]:
                    break
            time.sleep(0.5)
    finally:
        for proc, out in procs:
            proc.terminate()
            proc.wait(30)
            out.close()

    # the archive: one Media row per item, with the reference the store answers
    store = MediaStore.of(settings)
    media = [e for e in read_events(settings.archive_dir, run.run_id) if e.kind == MEDIA]
    assert [(e.body["name"], e.body["step"], e.body["kind"]) for e in media] == [
        ("samples/grid", 3, "image"),
        ("episode/video", 5, "video"),
        ("speech", 7, "audio"),
        ("completion", 9, "text"),
        ("samples/grid", 8, "image"),
    ]
    image = media[0].body
    assert image["caption"] == "first batch" and (image["width"], image["height"]) == (48, 64)
    png = store.get(image["ref"], image["size"])
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), PICTURE)
    assert store.get(media[3].body["ref"]).decode() == TEXT

    # TensorBoard: its own reader decodes what was logged, at the logged step
    acc = tb_media(next(live.glob(f"vision/media-{run.run_id}")))
    images = acc.Images("samples/grid")
    assert [i.step for i in images] == [3, 8]
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(images[0].encoded_image_string))), PICTURE)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(images[1].encoded_image_string))), PICTURE[::-1])
    (video,) = acc.Images("episode/video")
    gif = Image.open(io.BytesIO(video.encoded_image_string))
    assert video.step == 5 and gif.n_frames == 6 and gif.size == (16, 16)
    gif.seek(2)
    frame = np.asarray(gif.convert("RGB"), dtype=int)
    assert np.abs(frame - FRAMES[2]).mean() < 40  # a GIF has 256 colours a frame: close, not equal
    (clip,) = acc.Audio("speech")
    assert clip.step == 7 and clip.sample_rate == 16000
    with wave.open(io.BytesIO(clip.encoded_audio_string)) as w:
        samples = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2") / 32767
    assert np.abs(samples - TONE).max() < 1e-3
    (text,) = acc.Tensors("completion")
    assert text.step == 9 and text.tensor_proto.string_val[0].decode() == TEXT

    # W&B: its offline run file has the media rows, and the run folder the files W&B copied
    wb = read_run(wb_root, run.run_id)
    rows = {r["metricbus/step"]: r for r in wb["history"] if any(k in r for k in ("samples/grid", "speech"))}
    rows.update({r["metricbus/step"]: r for r in wb["history"] if "episode/video" in r or "completion" in r})
    assert (
        rows[3]["samples/grid"]["_type"] == "image-file"
        and rows[3]["samples/grid"]["caption"] == "first batch"
    )
    assert rows[5]["episode/video"]["_type"] == "video-file"
    assert rows[7]["speech"]["_type"] == "audio-file"
    assert rows[9]["completion"]["_type"] == "html-file"
    files = run_file(wb_root, run.run_id).parent / "files"
    copied = files / rows[3]["samples/grid"]["path"]
    assert np.array_equal(np.asarray(Image.open(copied)), PICTURE)
    assert "42" in (files / rows[9]["completion"]["path"]).read_text()

    def replay(to: str, out):
        command = cli(settings, "replay", "--run", run.run_id, "--to", to, "--out", str(out))
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180)
        assert done.returncode == 0, done.stderr
        return out

    # a replay into a new TensorBoard directory gives what live gave
    out = replay("tensorboard", tmp_path / "replayed")
    again = tb_media(next(out.glob(f"vision/media-{run.run_id}")))
    assert [(i.step, i.encoded_image_string) for i in again.Images("samples/grid")] == [
        (i.step, i.encoded_image_string) for i in images
    ]
    assert again.Audio("speech")[0].encoded_audio_string == clip.encoded_audio_string

    # a replay into a new W&B directory: the same media rows, the same files (W&B's own digests)
    replayed = replay("wandb", tmp_path / "wandb-replayed")

    def media_rows(history):
        return sorted(
            (r["metricbus/step"], k, v["_type"], v["sha256"])
            for r in history
            for k, v in r.items()
            if isinstance(v, dict) and "sha256" in v
        )

    assert len(media_rows(wb["history"])) == 5
    assert media_rows(read_run(replayed, run.run_id)["history"]) == media_rows(wb["history"])

    # the report inlines them: the first image's PNG as a data URI, the text escaped
    page = tmp_path / "report.html"
    done = subprocess.run(
        cli(settings, "report", run.run_id, "--out", str(page)),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert "data:image/png;base64," + base64.b64encode(png).decode() in text
    assert "data:image/gif;base64," in text and "data:audio/wav;base64," in text
    assert "The answer is &lt;b&gt;42&lt;/b&gt;" in text and "<b>42</b>" not in text
    assert "samples/grid <span class='muted'>(2 logged)</span>" in text  # both its images
    assert text.count("data:image/png;base64,") == 2


COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30), (30, 200, 200)]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: `make test` installs it")
def test_the_run_page_shows_the_image_at_the_step_the_slider_chooses(settings, dashboard, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    run = Run("vision", name="slider", settings=settings, system_metrics=False)
    for step, colour in enumerate(COLOURS):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        run.log_image(
            "samples/prediction", np.full((24, 32, 3), colour, np.uint8), step=step, caption=f"batch {step}"
        )
    run.log_text("completion", "<script>alert(1)</script> is text here", step=2)
    assert run.flush(20)
    status, body = get(f"{dashboard}/api/media/{'0' * 64}?kind=image")
    assert status == 404 and b"not in the store" in body
    status, _ = get(f"{dashboard}/api/media/..%2F..%2Fetc%2Fpasswd")
    assert status == 404

    def shown_colour(page):  # the pixel the browser decoded from the <img> it shows
        return tuple(
            page.locator("[data-media='samples/prediction'] img").evaluate(
                """img => { const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;
                   const g = c.getContext('2d'); g.drawImage(img, 0, 0); return Array.from(g.getImageData(5, 5, 1, 1).data.slice(0, 3)); }"""
            )
        )

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.goto(f"{dashboard}/runs/{run.run_id}")
            panel = page.locator("[data-media='samples/prediction']")
            expect(panel.locator(".media-at")).to_have_text("4 (5 of 5)", timeout=20_000)
            page.wait_for_function(
                "() => document.querySelector(\"[data-media='samples/prediction'] img\")?.complete"
            )
            assert shown_colour(page) == COLOURS[4]  # the latest step first
            expect(panel.locator(".media-caption")).to_have_text("batch 4")
            panel.locator("input[type=range]").fill("1")  # the user picks step 1
            expect(panel.locator(".media-at")).to_have_text("1 (2 of 5)")
            page.wait_for_function(
                "() => document.querySelector(\"[data-media='samples/prediction'] img\")?.complete"
            )
            assert shown_colour(page) == COLOURS[1]
            text = page.locator("[data-media='completion'] pre")
            expect(text).to_have_text("<script>alert(1)</script> is text here")  # shown as text, never run
            page.locator("#media").screenshot(path=str(tmp_path / "media.png"))

            run.log_image(
                "samples/prediction", np.zeros((24, 32, 3), np.uint8), step=9
            )  # while the page is open
            assert run.flush(20)
            expect(panel.locator(".media-at")).to_have_text(
                "1 (2 of 6)", timeout=20_000
            )  # the user's step stays
            assert shown_colour(page) == COLOURS[1]
        finally:
            browser.close()
    run.finish()


SW_SCRIPT = textwrap.dedent(
    """
    import sys
    IMPORT
    import numpy as np
    rng = np.random.default_rng(3)
    writer = SummaryWriter(log_dir=sys.argv[1])
    for step in range(3):
        writer.add_scalar("loss", 1.0 / (step + 1), step)
        writer.add_image("one", rng.integers(0, 256, size=(3, 20, 30), dtype=np.uint8), step)
        writer.add_image("hwc", rng.integers(0, 256, size=(10, 12, 3), dtype=np.uint8), step, dataformats="HWC")
        writer.add_images("batch", rng.integers(0, 256, size=(11, 3, 8, 6), dtype=np.uint8), step)
        writer.add_audio("tone", np.sin(np.linspace(0, 50, 4000))[None] * 0.5, step, sample_rate=8000)
    writer.close()
    """
)


def test_a_summary_writer_scripts_media_decode_as_torchs_own(settings, sink, tmp_path):
    pytest.importorskip("torch", reason="torch is an optional extra; `make test` installs it")
    sink(flush_interval=0.3, kind="tensorboard")
    env = {**os.environ, **settings.to_env(), "METRICBUS_PROJECT": "sw-media"}
    for where, line in (
        ("theirs", "from torch.utils.tensorboard import SummaryWriter"),
        ("ours", "from metricbus.tensorboard import SummaryWriter"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", SW_SCRIPT.replace("IMPORT", line), str(tmp_path / where)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    theirs = tb_media(tmp_path / "theirs")
    deadline = time.monotonic() + 60
    while True:  # the TensorBoard sink's directory of our run, once it holds every item
        dirs = list((settings.data_dir / "tensorboard" / "sw-media").glob("*"))
        ours = tb_media(dirs[0]) if dirs else None
        if (
            ours is not None
            and len(ours.Tags()["images"]) == 3
            and all(len(ours.Images(t)) == 3 for t in ours.Tags()["images"])
        ):
            if ours.Tags()["audio"] and len(ours.Audio("tone")) == 3:
                break
        assert time.monotonic() < deadline, ours.Tags() if ours else "no run directory"
        time.sleep(0.5)
    assert sorted(ours.Tags()["images"]) == sorted(theirs.Tags()["images"]) == ["batch", "hwc", "one"]

    def pixels(acc, tag):
        return [
            (i.step, np.asarray(Image.open(io.BytesIO(i.encoded_image_string)).convert("RGB")))
            for i in acc.Images(tag)
        ]

    for tag in ("one", "hwc", "batch"):  # batch: TensorBoard's grid of 8 a row, as torch makes it
        for (step_a, a), (step_b, b) in zip(pixels(ours, tag), pixels(theirs, tag), strict=True):
            assert step_a == step_b and np.array_equal(a, b), tag

    def samples(clip):
        with wave.open(io.BytesIO(clip.encoded_audio_string)) as w:
            return w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")

    for a, b in zip(ours.Audio("tone"), theirs.Audio("tone"), strict=True):
        (rate_a, pcm_a), (rate_b, pcm_b) = samples(a), samples(b)
        assert a.step == b.step and rate_a == rate_b == 8000 and np.array_equal(pcm_a, pcm_b)


def _walk_env() -> type:
    import gymnasium as gym

    class Walk(gym.Env):
        """A walk on a line, rendered as a 32x48 frame with a bar where the walker is (no pygame)."""

        metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
        render_mode = "rgb_array"

        def __init__(self, render_mode: str = "rgb_array") -> None:
            self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
            self.action_space = gym.spaces.Discrete(2)
            self.x, self.t = 0, 0

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.x, self.t = 24, 0
            return np.array([0.0], np.float32), {}

        def step(self, action):
            self.x = min(47, max(0, self.x + (1 if action else -1)))
            self.t += 1
            return np.array([(self.x - 24) / 24], np.float32), float(action), False, self.t >= 30, {}

        def render(self):
            frame = np.zeros((32, 48, 3), np.uint8)
            frame[:, self.x] = (255, 200, 0)
            return frame

    return Walk


_Walk = _walk_env()


@pytest.mark.frameworks
def test_an_sb3_run_with_a_video_recorder_shows_its_episode_videos_in_tensorboard_and_the_dashboard(
    settings, sink, dashboard, tmp_path
):
    pytest.importorskip("stable_baselines3", reason="SB3 is an optional extra; `make test` installs it")
    pytest.importorskip("moviepy", reason="SB3's VecVideoRecorder needs moviepy; `make test` installs it")
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecVideoRecorder

    from metricbus.sb3 import MetricbusCallback

    sink(flush_interval=0.3, kind="tensorboard")
    env = make_vec_env(_Walk, n_envs=1, seed=0)
    env = VecVideoRecorder(
        env, str(tmp_path / "videos"), record_video_trigger=lambda s: s % 128 == 0, video_length=20
    )
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=64, n_epochs=1, seed=0, device="cpu")
    callback = MetricbusCallback(project="sb3-video", settings=settings, system_metrics=False)
    model.learn(256, callback=callback)
    env.close()
    run = callback.run
    assert run is not None and run.stats()["media_logged"] >= 2
    assert len(list((tmp_path / "videos").glob("*.mp4"))) >= 2  # the recorder still writes its own files

    deadline = time.monotonic() + 60
    while True:
        dirs = list((settings.data_dir / "tensorboard" / "sb3-video").glob(f"*{run.run_id}"))
        acc = tb_media(dirs[0]) if dirs else None
        if (
            acc is not None
            and "rollout/video" in acc.Tags()["images"]
            and len(acc.Images("rollout/video")) >= 2
        ):
            break
        assert time.monotonic() < deadline, "the videos never reached TensorBoard"
        time.sleep(0.5)
    first = acc.Images("rollout/video")[0]
    gif = Image.open(io.BytesIO(first.encoded_image_string))
    assert gif.n_frames == 21 and gif.size == (48, 32)  # the env's frames, as rendered

    status, body = get(f"{dashboard}/api/runs/{run.run_id}")
    assert status == 200
    videos = json.loads(body)["media"]["rollout/video"]
    assert len(videos) >= 2 and videos[0]["kind"] == "video" and videos[0]["caption"].endswith(".mp4")
    status, data = get(f"{dashboard}/api/media/{videos[0]['digest']}?kind=video")
    assert status == 200 and data == first.encoded_image_string  # the page plays what TensorBoard shows
