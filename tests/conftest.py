"""Shared fixtures.

Videos and datasets: tiny synthetic clips (made once per session) and the path
to the real split files in ../shared/data, which users of the project do not
have (tests that need them skip).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data next to the repository; skips the test when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real split files not available ({SHARED_DATA} is absent)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def index_video(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: ``index_video(num_frames, size=(W, H))`` -> mp4 whose frame i encodes i (cached)."""
    from .helpers.videos import write_index_video

    folder = tmp_path_factory.mktemp("index_videos")
    cache: dict[tuple[int, tuple[int, int]], Path] = {}

    def make(num_frames: int, size: tuple[int, int] = (32, 24)) -> Path:
        key = (num_frames, tuple(size))
        if key not in cache:
            cache[key] = write_index_video(folder / f"index_{num_frames}_{size[0]}x{size[1]}.mp4", num_frames, size)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def demo_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default demo dataset (120 videos of 16 frames, 64x48); returns captions.csv.

    Its videos are in ``captions.parent / "videos"``. Shared by the session: do not modify.
    """
    from dab_pipeline.video.synthetic import make_demo_dataset

    return make_demo_dataset(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep dab-tiny's generated weights out of the user's ~/.cache during tests."""
    import os

    os.environ["DAB_CACHE"] = str(tmp_path_factory.mktemp("dab_cache"))
    # the compiled CPU kernels are kept across sessions (a build takes ~10 s), keyed by their source
    os.environ.setdefault(
        "DAB_KERNEL_CACHE", str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "dab-kernels")
    )


@pytest.fixture(scope="session")
def tiny_folder_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `folder` dataset of 6 index videos (5 to 37 frames), 2 captions each; returns captions.csv."""
    import csv

    from .helpers.videos import write_index_video

    root = tmp_path_factory.mktemp("tiny_folder")
    (root / "videos").mkdir()
    rows = []
    for i, n in enumerate([5, 12, 13, 20, 30, 37]):
        write_index_video(root / "videos" / f"clip{i}.mp4", n, (32, 24))
        split = "train" if i < 4 else ("val" if i == 4 else "test")
        rows += [
            (f"clip{i}.mp4", f"clip number {i} with {n} frames", split),
            (f"clip{i}.mp4", f"another caption of clip {i}", split),
        ]
    with open(root / "captions.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["video", "caption", "split"])
        w.writerows(rows)
    return root / "captions.csv"
