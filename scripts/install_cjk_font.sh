#!/usr/bin/env bash
# Best effort: a CJK font so Chinese tokens in attention heatmaps render as glyphs, not boxes.
# Never fails the set-up; the plotting code falls back cleanly when no CJK font is found.
if fc-list 2>/dev/null | grep -qiE "cjk|wqy|heiti|simhei|noto sans sc"; then exit 0; fi
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing a CJK font (fonts-wqy-microhei) for Chinese attention heatmaps"
    (apt-get install -y -qq fonts-wqy-microhei >/dev/null 2>&1 ||
        (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq fonts-wqy-microhei >/dev/null 2>&1)) ||
        echo "could not install a CJK font; Chinese heatmap labels will fall back to the default font"
else
    echo "no CJK font found; install one (e.g. fonts-wqy-microhei) for Chinese heatmap labels"
fi
exit 0
