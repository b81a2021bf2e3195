#!/usr/bin/env bash
# A headless-Chromium screenshot of `dab serve`'s search page after a query (docs/search.md).
#
#   scripts/screenshot_search.sh RUN STORE INDEX "a query" out.png [port]
#
# Starts the server on 127.0.0.1 (loopback only), waits for /healthz (at most 120 s), takes the
# screenshot, and stops the server. Needs the serve extra and a chromium binary (Debian: apt-get install chromium).
set -euo pipefail
run=$1 store=$2 index=$3 query=$4 out=$5 port=${6:-8765}
dab=${DAB:-dab}
chrome=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$chrome" ] || { echo "no chromium found (apt-get install chromium)" >&2; exit 2; }
"$dab" serve --run "$run" --features "$store" --index "$index" --host 127.0.0.1 --port "$port" \
    --abstain-below "${ABSTAIN:-0.5}" &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
    if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" 2>/dev/null; then
        break
    fi
    kill -0 $server 2>/dev/null || { echo "dab serve exited before answering" >&2; exit 1; }
    sleep 0.5
done
url="http://127.0.0.1:$port/?q=$(python3 -c 'import sys,urllib.parse; print(urllib.parse.quote_plus(sys.argv[1]))' "$query")"
"$chrome" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1000 \
    --screenshot="$(realpath -m "$out")" "$url" 2>/dev/null
echo "wrote $out ($url)"
