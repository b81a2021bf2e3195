#!/usr/bin/env bash
# Render a result page in headless Chromium to a PNG, as a person would see it (not run in CI).
#   scripts/screenshot_examples.sh [PAGE] [OUT.png]     (default: the demo's examples page -> docs/examples.png)
# Needs Chromium (Debian: apt-get install chromium). Run `make demo` first for the default page.
set -euo pipefail
page="${1:-demo_out/runs/dab/examples.html}"
out="${2:-docs/examples.png}"
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [ -z "$browser" ]; then
  echo "no Chromium found (Debian: apt-get install chromium)" >&2
  exit 1
fi
[ -f "$page" ] || { echo "$page not found (run make demo first)" >&2; exit 1; }
"$browser" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1500 \
  --screenshot="$(realpath -m "$out")" "file://$(realpath "$page")" 2>/dev/null
# 128 colours keep the page legible at a third of the size (the repository keeps one)
if [ -x .venv/bin/python ]; then
  .venv/bin/python -c "from PIL import Image; import sys; im = Image.open(sys.argv[1]).convert('RGB'); \
im.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(sys.argv[1], optimize=True)" "$out"
fi
echo "wrote $out"
