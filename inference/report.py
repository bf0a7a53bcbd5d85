"""One self-contained HTML page for explanations (predict.py --explain --html report.html).

Nothing is fetched: the CSS, the script and the data are inline, so the file opens offline and can be mailed. Per
text: label and probabilities, the tokens shaded by one method at a time (the switch at the top: orange supports
the predicted class, blue speaks against it; each method scaled to its own largest |score| in that text), that
text's faithfulness figures (Spearman with occlusion, deletion drops), and the attention heatmap of every layer and
head (query rows × key columns, each map scaled to its own largest weight); hovering a token, or a heatmap row,
outlines that query's row in every map of the text. Texts are HTML-escaped and tokens set as textContent: never markup.
"""

import html
import json

from data.files import write_text
from inference.explain import METHODS

TITLES = {"attention": "attention (last layer)", "rollout": "attention rollout", "grad_x_input": "gradient × input",
          "integrated_gradients": "Integrated Gradients", "occlusion": "occlusion (exact)"}

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", "Noto Sans CJK SC", "Source Han Sans SC",
       "WenQuanYi Micro Hei", "Microsoft YaHei", "PingFang SC", "Hiragino Sans GB", sans-serif;
       margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.3em; } .card { border: 1px solid #ccc; border-radius: 6px; padding: 1em; margin: 1em 0; }
#switch button { margin-right: .4em; padding: .3em .7em; border: 1px solid #888; background: #f4f4f4; cursor: pointer; }
#switch button.active { background: #333; color: #fff; }
.tokens { line-height: 2.2em; font-size: 1.1em; }
.tok { padding: .15em .25em; margin: 0 .1em; border-radius: 3px; border: 2px solid transparent; cursor: default; }
.tok.hl { border-color: #000; }
.probs span { display: inline-block; margin-right: 1em; } .label { font-weight: bold; }
.note { color: #666; font-size: .85em; } table.faith { border-collapse: collapse; font-size: .85em; margin: .5em 0; }
table.faith td, table.faith th { border: 1px solid #ddd; padding: .15em .5em; text-align: right; }
.maps { display: flex; flex-wrap: wrap; gap: .8em; } .map { font-size: .8em; text-align: center; }
canvas { border: 1px solid #999; image-rendering: pixelated; } .hover { min-height: 1.3em; font-size: .9em; }
"""

SCRIPT = """
const DATA = JSON.parse(document.getElementById('data').textContent);
let method = DATA.methods.find(m => DATA.texts.some(t => t.scores[m])) || DATA.methods[0];
function shade(v, top) {
  const a = top > 0 ? Math.min(1, Math.abs(v) / top) : 0;
  return v >= 0 ? `rgba(255,140,0,${a.toFixed(3)})` : `rgba(30,110,255,${a.toFixed(3)})`;
}
function paintTokens() {
  document.querySelectorAll('#switch button').forEach(b => b.classList.toggle('active', b.dataset.method === method));
  DATA.texts.forEach((t, i) => {
    const s = t.scores[method];
    const top = s ? Math.max(...s.map(Math.abs)) : 0;
    document.querySelectorAll(`#text${i} .tok`).forEach((el, j) => {
      el.style.backgroundColor = s ? shade(s[j], top) : 'transparent';
      el.title = s ? `${method}: ${s[j].toFixed(4)}` : `${method}: not applicable`;
    });
    document.querySelector(`#text${i} .method-note`).textContent = t.notes[method] || '';
  });
}
function drawMap(canvas, m, cell, row) {
  const ctx = canvas.getContext('2d'); const n = m.length, k = m[0].length;
  const top = Math.max(1e-9, ...m.map(r => Math.max(...r)));
  for (let i = 0; i < n; i++) for (let j = 0; j < k; j++) {
    const v = m[i][j] / top; const c = Math.round(255 * (1 - v));
    ctx.fillStyle = `rgb(${c},${Math.round(255 - 155 * v)},255)`; ctx.fillRect(j * cell, i * cell, cell, cell);
  }
  if (row !== null && row < n) {
    ctx.strokeStyle = '#e00'; ctx.lineWidth = 2; ctx.strokeRect(1, row * cell + 1, k * cell - 2, cell - 2);
  }
}
function highlight(i, row) {
  const t = DATA.texts[i];
  document.querySelectorAll(`#text${i} .tok`).forEach((el, j) => el.classList.toggle('hl', j === row));
  document.querySelectorAll(`#text${i} canvas`).forEach(c => {
    drawMap(c, t.attention[+c.dataset.layer][+c.dataset.head], +c.dataset.cell, row);
    c.dataset.row = row === null ? '' : row;
  });
  const info = document.querySelector(`#text${i} .hover`);
  if (row === null) { info.textContent = ''; return; }
  const parts = t.attention.map((layer, l) => {
    const avg = layer[0].map((_, j) => layer.reduce((s, h) => s + h[row][j], 0) / layer.length);
    const best = avg.map((v, j) => [v, j]).sort((a, b) => b[0] - a[0]).slice(0, 3);
    return `layer ${l}: ` + best.map(([v, j]) => `${t.tokens[j]} ${v.toFixed(2)}`).join(', ');
  });
  info.textContent = `query "${t.tokens[row]}" looks at (mean of heads) — ` + parts.join(' | ');
}
function build() {
  const sw = document.getElementById('switch');
  DATA.methods.forEach(m => {
    const b = document.createElement('button'); b.dataset.method = m; b.textContent = DATA.titles[m];
    b.onclick = () => { method = m; paintTokens(); }; sw.appendChild(b);
  });
  DATA.texts.forEach((t, i) => {
    const card = document.getElementById(`text${i}`);
    const toks = card.querySelector('.tokens');
    t.tokens.forEach((tok, j) => {
      const el = document.createElement('span'); el.className = 'tok'; el.textContent = tok;
      el.onmouseenter = () => highlight(i, j); el.onmouseleave = () => highlight(i, null); toks.appendChild(el);
    });
    const maps = card.querySelector('.maps');
    if (!t.attention) { maps.textContent = t.notes.attention || 'no token × token attention for this model'; return; }
    const n = t.tokens.length, cell = Math.max(3, Math.min(24, Math.floor(260 / n)));
    t.attention.forEach((layer, l) => layer.forEach((m, h) => {
      const box = document.createElement('div'); box.className = 'map';
      const c = document.createElement('canvas'); c.width = m[0].length * cell; c.height = m.length * cell;
      Object.assign(c.dataset, {layer: l, head: h, cell: cell, row: ''});
      c.onmousemove = e => highlight(i, Math.min(n - 1, Math.floor(e.offsetY / cell)));
      c.onmouseleave = () => highlight(i, null);
      box.appendChild(c); box.appendChild(document.createElement('br'));
      box.appendChild(document.createTextNode(`layer ${l} head ${h}`)); maps.appendChild(box);
      drawMap(c, m, cell, null);
    }));
  });
  paintTokens();
}
build();
"""


def faithfulness_table(faithfulness: dict) -> str:
    ks = faithfulness["ks"]
    head = "".join(f"<th>drop k={k}</th>" for k in ks)
    rows = []
    for method, drops in faithfulness["deletion"].items():
        r = faithfulness["spearman"].get(method)
        r = "—" if r is None else f"{r:.2f}"
        cells = "".join(f"<td>{d:.3f}</td>" for d in drops)
        name = html.escape(TITLES.get(method, method))
        rows.append(f"<tr><th style='text-align:left'>{name}</th><td>{r}</td>{cells}</tr>")
    return (f"<table class='faith'><tr><th>method</th><th>Spearman with occlusion</th>{head}</tr>{''.join(rows)}"
            "</table>")


def render(explanations, title: str = "Why did it predict that?") -> str:
    """The page for a list of inference.explain.Explanation, as a string."""
    texts, cards = [], []
    for i, e in enumerate(explanations):
        attention = None
        if e.attention is not None:  # per layer (H, n, n), 3 decimals: enough for a colour, a sixth of the bytes
            attention = [layer.double().round(decimals=3).tolist() for layer in e.attention]
        texts.append({"tokens": e.tokens, "scores": e.scores, "notes": e.notes, "attention": attention})
        probabilities = "".join(f"<span>{html.escape(name)}: {p:.3f}</span>" for name, p in e.probabilities.items())
        truncated = (f"<p class='note'>{html.escape(e.notes['truncated'])}</p>" if e.truncated_from else "")
        cards.append(
            f"<div class='card' id='text{i}'><div class='note'>text {i}</div>"
            f"<p>{html.escape(e.text)}</p>{truncated}"
            f"<p class='probs'><span class='label'>predicted: {html.escape(e.label)}</span>{probabilities}</p>"
            f"<div class='tokens'></div><p class='note method-note'></p>"
            f"<details open><summary>faithfulness for this text (occlusion is the truth)</summary>"
            f"{faithfulness_table(e.faithfulness)}</details>"
            f"<h3>attention per layer and head</h3><div class='hover note'></div><div class='maps'></div></div>"
        )
    data = {"methods": list(METHODS), "titles": TITLES, "texts": texts}
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        "<p class='note'>Token shading: orange supports the predicted class, blue speaks against it; each method is "
        "scaled to its own largest |score| in the text. Hover a token (or a heatmap row) to outline its row.</p>"
        f"<div id='switch'></div>{''.join(cards)}"
        f"<script type='application/json' id='data'>{payload}</script><script>{SCRIPT}</script></body></html>\n"
    )


def write_report(explanations, path) -> None:
    """The page, written atomically (data/files.py): WriteError (one line) leaves an existing page as it was."""
    write_text(path, render(explanations), "report")
