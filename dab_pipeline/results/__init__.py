"""What a person reads of a run: metrics.json, report.md and plots (``report``), the examples page (``page``, with its
jinja2 template) and the JPEG strips of video frames a store keeps for it (``thumbnails``)."""
