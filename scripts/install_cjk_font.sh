#!/usr/bin/env bash
# `make fonts` (opt-in; installing a system package needs root): a CJK font so Chinese tokens in attention
# heatmaps render as glyphs, not boxes. Without --install it only refreshes matplotlib's font cache when a CJK
# font is already there. Never fails; the plotting code falls back with one warning when no CJK font is found.
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3

# Matplotlib keeps its font list in a JSON cache built on first import, and a font installed after that stays
# invisible to it. When the system has a CJK font the cache does not name, drop the cache and rebuild it.
refresh_matplotlib_font_cache() {
    "$PY" - <<'PYTHON' 2>/dev/null || true
import pathlib, subprocess, sys
import matplotlib
from matplotlib import font_manager
hints = ("cjk", "wqy", "wenquanyi", "heiti", "simhei", "noto sans sc", "droid sans fallback")
if any(h in entry.name.lower() for entry in font_manager.fontManager.ttflist for h in hints):
    sys.exit(0)
for cache in pathlib.Path(matplotlib.get_cachedir()).glob("fontlist-*.json"):
    cache.unlink()
subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], check=False)  # rebuilds the cache
print("rebuilt matplotlib's font cache so it sees the CJK font")
PYTHON
}

if fc-list 2>/dev/null | grep -qiE "cjk|wqy|heiti|simhei|noto sans sc"; then
    refresh_matplotlib_font_cache
    exit 0
fi
if [ "${1:-}" = "--install" ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing a CJK font (fonts-wqy-microhei) for Chinese attention heatmaps"
    if (apt-get install -y -qq fonts-wqy-microhei >/dev/null 2>&1 ||
        (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq fonts-wqy-microhei >/dev/null 2>&1)); then
        refresh_matplotlib_font_cache
    else
        echo "could not install a CJK font; Chinese heatmap labels will fall back to the default font"
    fi
else
    echo "no CJK font found; install one (e.g. fonts-wqy-microhei) for Chinese heatmap labels"
fi
exit 0
