"""What several test files share, imported by name: ``from ..helpers.training import train_config``.

A package of plain modules rather than conftest fixtures, because most of these are functions a test calls with
its own arguments (a store of 20 videos here, a run stopped at step 4 there) or hands to a subprocess by import
path, which fixtures do not do; an import also says where a name comes from. Pytest fixtures (the session's
index videos and datasets) stay in ``tests/conftest.py``, and ``tests/store/conftest.py`` holds the backend
parameter of the store tests.

* ``runner``: ``invoke``, `dab` run in-process by click's runner, and ``extract_args``, the tiny extraction;
* ``training``: a small train config, a run stopped part-way, the loss patch that stops it;
* ``stores``: ``text_store``, a store whose captions dab-tiny re-encodes (search and serve);
* ``store_rows``: the deterministic rows the store tests write and check (also run by their subprocesses);
* ``videos``: index-encoding test videos (frame i shows i) and damaged, truncated and unreadable files (their own
  tests are tests/video/test_test_videos.py);
* ``models``: small seeded models of every variant, hand-made run folders, random CLIP-like inputs.

The factories benchmarks also use (``random_store``, ``empty_store``, ``store_index``) stay in
``dab_pipeline.testing``. No test file imports another test file (tests/test_architecture.py checks it).
"""
