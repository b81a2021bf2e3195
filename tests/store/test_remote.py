"""A store on object storage: the same bytes as a local store, only the asked rows fetched, one line for every
way a bucket can fail, and no answer from a partial read (store/backend_remote.py, docs/stores.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import ConfigError, StoreError, WriteError
from dab_pipeline.core.location import StoreURL, is_url, location
from dab_pipeline.store import backend_remote, open_store
from dab_pipeline.testing import empty_store, random_store

from ..helpers.s3 import CuttingProxy, free_port, local_s3, s3_environment


@pytest.fixture(scope="module")
def s3():
    with local_s3() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_store(tmp_path_factory.mktemp("remote") / "local.zarr", n_videos=30, frames=4, dim=16, seed=3)


def _same_store(url: str, local: Path) -> None:
    rows = np.array([0, 3, 4, 5, 17, 29])
    with open_store(local) as a, open_store(url) as b:
        assert b.remote and not a.remote
        assert list(a.video_ids) == list(b.video_ids) and list(a.caption_text) == list(b.caption_text)
        for x, y in zip(a.read_videos(rows), b.read_videos(rows)):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(a.read_captions(np.arange(20)), b.read_captions(np.arange(20)))
        np.testing.assert_array_equal(a.status(), b.status())
        assert b.verify() == [] and b.is_complete
        assert b.summary()["file_bytes"] == a.summary()["file_bytes"]


def test_location_reads_paths_and_urls() -> None:
    assert location("a/b.zarr") == Path("a/b.zarr") and location("file:///x/y.zarr") == Path("/x/y.zarr")
    url = location("memory://bucket/dir/s.zarr/")
    assert isinstance(url, StoreURL) and str(url) == "memory://bucket/dir/s.zarr" and url.suffix == ".zarr"
    assert url.fs_path == "bucket/dir/s.zarr" and url.name == "s.zarr" and is_url("s3://b/k") and not is_url("b/k")
    with pytest.raises(ConfigError, match="unknown storage protocol 'nope'"):
        location("nope://bucket/s.zarr")
    with pytest.raises(ConfigError, match="credentials in a store URL are refused") as err:
        location("s3://KEY:SECRET@bucket/s.zarr")
    assert "SECRET" not in str(err.value) and "KEY" not in str(err.value)


def test_a_protocol_whose_package_is_missing_names_it() -> None:
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401

        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match="gs:// stores need a package that is not installed"):
        location("gs://bucket/s.zarr")


def test_a_memory_store_reads_as_the_local_one(local: Path) -> None:
    url = f"memory://dab-{uuid.uuid4().hex[:8]}/s.zarr"
    random_store(url, n_videos=30, frames=4, dim=16, seed=3)
    _same_store(url, local)


def test_an_s3_store_reads_as_the_local_one(s3: str, local: Path) -> None:
    random_store("s3://dab/same.zarr", n_videos=30, frames=4, dim=16, seed=3)
    _same_store("s3://dab/same.zarr", local)


def test_a_shortlist_read_fetches_only_its_rows(s3: str) -> None:
    """Rows scattered over a big array: the bytes fetched are the rows' bytes, one ranged GET per run of rows."""
    url = "s3://dab/rows.zarr"
    random_store(url, n_videos=30, frames=4, dim=16, seed=1)
    rows = np.array([2, 3, 4, 11, 20])  # three runs
    with open_store(url) as st:
        raw = st._b.raw_chunks("videos/frames")
        before = (st._b.stats.requests, st._b.stats.bytes)
        out = np.empty((len(rows), 4, 16), np.float32)
        st._b.read_rows("videos/frames", rows, out)
        requests, fetched = st._b.stats.requests - before[0], st._b.stats.bytes - before[1]
    assert requests == 3 and fetched == len(rows) * raw.row_bytes


def test_errors_of_a_bucket_are_one_line(s3: str, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        open_store("s3://no-such-bucket/s.zarr")
    with pytest.raises(StoreError, match="does not exist"):
        open_store("s3://dab/never-written.zarr")
    with pytest.raises(StoreError, match="HDF5 store is read from a local file only"):
        open_store("s3://dab/s.h5")
    random_store("s3://dab/exists.zarr", n_videos=30)
    with pytest.raises(StoreError, match="already exists"):
        random_store("s3://dab/exists.zarr", n_videos=30)
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with s3_environment(nobody), pytest.raises(StoreError, match="is unreachable") as err:
        open_store("s3://dab/exists.zarr")
    assert "\n" not in str(err.value)


def test_an_unauthorised_bucket_is_one_line(s3: str) -> None:
    """moto checks signatures once its no-auth allowance is used up: the test's keys are then unknown."""
    settings = pytest.importorskip("moto.settings")
    random_store("s3://dab/auth.zarr", n_videos=30)
    saved = settings.INITIAL_NO_AUTH_ACTION_COUNT
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    try:
        with pytest.raises(StoreError, match="access denied|not allowed") as err:
            open_store("s3://dab/auth.zarr")
    finally:
        settings.INITIAL_NO_AUTH_ACTION_COUNT = saved
    assert "testing" not in str(err.value)  # the secret is not echoed


def test_an_interrupted_creation_says_overwrite_and_overwrite_replaces_it(s3: str) -> None:
    url = "s3://dab/interrupted.zarr"
    random_store(url, n_videos=30)
    fs = location(url).filesystem()
    meta = json.loads(fs.cat_file("dab/interrupted.zarr/zarr.json"))
    meta["attributes"] = {"dab_store_creating": True}  # as left by a kill before the attributes were written
    fs.pipe_file("dab/interrupted.zarr/zarr.json", json.dumps(meta).encode())
    with pytest.raises(StoreError, match="interrupted while it was being created.*--overwrite"):
        open_store(url)
    st = empty_store(url, 30, overwrite=True)
    st.close()
    with open_store(url) as st:
        assert st.num_videos == 30


def test_missing_credentials_are_named_not_blamed_on_the_network(
    s3: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """issue 59, item 8b: no credentials was "unreachable ...; check the endpoint and the network"; now it says what
    is missing and where credentials go, without echoing what was set."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):  # this machine's own ~/.aws is not asked
        monkeypatch.setenv(name, str(tmp_path / "absent"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # nor a cloud instance's metadata service
    for secret_only in (False, True):
        if secret_only:  # half a pair: botocore finds no credentials either; the secret is not echoed
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
        with pytest.raises(StoreError, match="no credentials were found") as err:
            open_store("s3://dab/any.zarr")
        said = str(err.value)
        assert "AWS_ACCESS_KEY_ID" in said and "AWS_SECRET_ACCESS_KEY" in said and "~/.aws/credentials" in said
        assert "network" not in said and "unreachable" not in said and "\n" not in said
        assert "s3cr3t" not in said


@pytest.fixture()
def proxy(s3: str):
    port = int(s3.rsplit(":", 1)[1])
    p = CuttingProxy(port)
    try:
        with s3_environment(p.endpoint):
            yield p
    finally:
        p.close()


def test_a_dropped_connection_is_retried_and_the_rows_are_whole(proxy: CuttingProxy, local: Path) -> None:
    random_store("s3://dab/drop.zarr", n_videos=30, frames=4, dim=16, seed=3)
    rows = np.array([1, 2, 9, 28])
    with open_store("s3://dab/drop.zarr") as st, open_store(local) as ref:
        proxy.cut(times=1, after=100)  # the next response ends 100 bytes in
        frames, mask = st.read_videos(rows)
        want = ref.read_videos(rows)
    assert proxy.cut_count == 1
    np.testing.assert_array_equal(frames, want[0])
    np.testing.assert_array_equal(mask, want[1])


@pytest.mark.slow  # about 10 s: botocore's own back-off under dab's four tries
def test_a_connection_that_keeps_dropping_fails_in_one_line(
    proxy: CuttingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backend_remote, "RETRY_WAIT_S", 0.01)
    random_store("s3://dab/drops.zarr", n_videos=30, frames=4, dim=16, seed=3)
    with open_store("s3://dab/drops.zarr") as st:
        proxy.cut(times=10_000, after=100)
        out = np.full((3, 4, 16), 7.0, np.float32)
        with pytest.raises(StoreError, match=r"failed 4 times .*nothing was served") as err:
            st._b.read_rows("videos/frames", np.array([0, 1, 2]), out)
        proxy.cut(times=0, after=0)
    assert "\n" not in str(err.value) and st._b.stats.retries == 3


def test_a_write_after_the_endpoint_is_lost_is_one_line(proxy: CuttingProxy) -> None:
    """issue 59, item 6: a write that cannot reach the endpoint is one WriteError naming the store and the array
    (it was botocore's EndpointConnectionError, chained under aiohttp's and the socket's); extraction adds how to
    resume (tests/stages/test_remote_store.py)."""
    st = empty_store("s3://dab/lost-write.zarr", 4, thumbnail_bytes=64)
    try:
        proxy.go_down()
        with pytest.raises(WriteError, match=r"^cannot write s3://dab/lost-write.zarr/videos/thumbnail: ") as err:
            st.write_thumbnails([0], [b"\xff\xd8 a jpeg"])
    finally:
        st.close()
    assert str(err.value).endswith("check the endpoint and the network") and "\n" not in str(err.value)


def test_a_process_that_creates_writes_and_reads_an_s3_store_closes_its_sessions(s3: str) -> None:
    """issue 59, item 8e: zarr's asynchronous filesystems were never closed, and every process that used an s3://
    store ended with aiohttp's "ERROR:asyncio:Unclosed client session" (one per store opened or created). The
    message comes as the process ends, so a process of its own runs what extraction does to a store."""
    code = (
        "from dab_pipeline.testing import empty_store; from dab_pipeline.store import open_store\n"
        "st = empty_store('s3://dab/sessions.zarr', 4, thumbnail_bytes=64); st.mark_failed(0, 'x'); st.close()\n"
        "with open_store('s3://dab/sessions.zarr', 'a') as st: st.mark_failed(1, 'y')\n"
        "with open_store('s3://dab/sessions.zarr') as st: print(len(st.failures()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "2", done.stderr
    assert "Unclosed" not in done.stderr and "asyncio" not in done.stderr, done.stderr
