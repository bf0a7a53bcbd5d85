const STATE = {methods: [], titles: {}, texts: []};
let method = null;
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function shade(v, top) {
  const a = top > 0 ? Math.min(1, Math.abs(v) / top) : 0;
  return v >= 0 ? `rgba(255,140,0,${a.toFixed(3)})` : `rgba(30,110,255,${a.toFixed(3)})`;
}
function paintTokens() {
  document.querySelectorAll('#switch button').forEach(b => b.classList.toggle('active', b.dataset.method === method));
  STATE.texts.forEach((t, i) => {
    if (!t.scores) return;
    const s = t.scores[method];
    const top = s ? Math.max(...s.map(Math.abs)) : 0;
    document.querySelectorAll(`#text${i} .tok`).forEach((e, j) => {
      e.style.backgroundColor = s ? shade(s[j], top) : 'transparent';
      e.title = s ? `${method}: ${s[j].toFixed(4)}` : `${method}: not applicable`;
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
  const t = STATE.texts[i];
  document.querySelectorAll(`#text${i} .tok`).forEach((e, j) => e.classList.toggle('hl', j === row));
  document.querySelectorAll(`#text${i} canvas`).forEach(c => {
    drawMap(c, t.attention[+c.dataset.layer][+c.dataset.head], +c.dataset.cell, row);
    c.dataset.row = row === null ? '' : row;
  });
  const info = document.querySelector(`#text${i} .hover`);
  if (row === null || !t.attention) { info.textContent = ''; return; }
  const parts = t.attention.map((layer, l) => {
    const avg = layer[0][0].map((_, j) => layer.reduce((s, h) => s + h[row][j], 0) / layer.length);
    const best = avg.map((v, j) => [v, j]).sort((a, b) => b[0] - a[0]).slice(0, 3);
    return `layer ${l}: ` + best.map(([v, j]) => `${t.tokens[j]} ${v.toFixed(2)}`).join(', ');
  });
  info.textContent = `query "${t.tokens[row]}" looks at (mean of heads) — ` + parts.join(' | ');
}
function faithfulnessTable(f) {
  const table = el('table', 'faith'), head = el('tr');
  const names = ['method', 'Spearman with occlusion', ...f.ks.map(k => `drop k=${k}`)];
  names.forEach(h => head.appendChild(el('th', '', h)));
  table.appendChild(head);
  Object.entries(f.deletion).forEach(([m, drops]) => {
    const tr = el('tr'), name = el('th', '', STATE.titles[m] || m), r = f.spearman[m];
    name.style.textAlign = 'left'; tr.appendChild(name);
    tr.appendChild(el('td', '', r === null || r === undefined ? '—' : r.toFixed(2)));
    drops.forEach(d => tr.appendChild(el('td', '', d === null ? '—' : d.toFixed(3))));
    table.appendChild(tr);
  });
  return table;
}
// One card per text, drawn from the JSON object `predict.py --explain --attention` prints (serve.py answers the same).
function card(t, i) {
  const box = el('div', 'card'); box.id = `text${i}`;
  box.appendChild(el('div', 'note', `text ${i}`)); box.appendChild(el('p', '', t.text));
  if (t.error) { box.appendChild(el('p', 'error', t.error)); return box; }
  if (t.notes.truncated) box.appendChild(el('p', 'note', t.notes.truncated));
  const probs = el('p', 'probs'); probs.appendChild(el('span', 'label', `predicted: ${t.label}`));
  Object.entries(t.probabilities).forEach(([name, p]) => probs.appendChild(el('span', '', `${name}: ${p.toFixed(3)}`)));
  box.appendChild(probs);
  const toks = el('div', 'tokens'); box.appendChild(toks); box.appendChild(el('p', 'note method-note'));
  const details = el('details'); details.open = true;
  details.appendChild(el('summary', '', 'faithfulness for this text (occlusion is the truth)'));
  details.appendChild(faithfulnessTable(t.faithfulness)); box.appendChild(details);
  box.appendChild(el('h3', '', 'attention per layer and head'));
  box.appendChild(el('div', 'hover note')); const maps = el('div', 'maps'); box.appendChild(maps);
  t.tokens.forEach((tok, j) => {
    const e = el('span', 'tok', tok);
    e.onmouseenter = () => highlight(i, j); e.onmouseleave = () => highlight(i, null); toks.appendChild(e);
  });
  if (!t.attention) {
    maps.textContent = t.notes.attention || 'no token × token attention for this model';
    return box;
  }
  const n = t.tokens.length, cell = Math.max(3, Math.min(24, Math.floor(260 / n)));
  t.attention.forEach((layer, l) => layer.forEach((m, h) => {
    const map = el('div', 'map'), c = el('canvas');
    c.width = m[0].length * cell; c.height = m.length * cell;
    Object.assign(c.dataset, {layer: l, head: h, cell: cell, row: ''});
    c.onmousemove = e => highlight(i, Math.min(n - 1, Math.floor(e.offsetY / cell)));
    c.onmouseleave = () => highlight(i, null);
    map.appendChild(c); map.appendChild(el('br')); map.appendChild(document.createTextNode(`layer ${l} head ${h}`));
    maps.appendChild(map); drawMap(c, m, cell, null);
  }));
  return box;
}
function show(data) {
  Object.assign(STATE, data);
  const sw = document.getElementById('switch');
  if (!sw.childElementCount) STATE.methods.forEach(m => {
    const b = el('button', '', STATE.titles[m]); b.dataset.method = m; b.type = 'button';
    b.onclick = () => { method = m; paintTokens(); }; sw.appendChild(b);
  });
  if (!method) method = STATE.methods.find(m => STATE.texts.some(t => t.scores && t.scores[m])) || STATE.methods[0];
  document.getElementById('cards').replaceChildren(...STATE.texts.map(card));
  paintTokens();
}
const PAGE = JSON.parse(document.getElementById('data').textContent);
show(PAGE);
