// The explanation page: cards drawn from the JSON objects `predict.py --explain --attention` prints.
// STATE.verdicts: the attention doctor's latest findings stored in the checkpoint (inference/verdicts.py), or null.
const STATE = {methods: [], signed: [], titles: {}, texts: [], verdicts: null};
let method = null, chosen = false;  // chosen: the reader clicked a method; the default no longer moves
const VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142], [31, 158, 137],
                 [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]];  // matplotlib's, as TensorBoard
const BLUES = [[255, 255, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
const PURPLE_ORANGE = [[84, 39, 136], [153, 142, 195], [247, 247, 247], [241, 163, 64], [179, 88, 6]];
const MAP_WIDTH = 360, LABEL_EVERY_TOKEN = 60;  // every token is named on the axes up to 60 tokens
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function rgb(stops, x) {  // x in [0, 1] → [r, g, b] along the stops
  const t = Math.max(0, Math.min(1, x)) * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(t));
  const f = t - i;
  return stops[i].map((a, k) => Math.round(a + f * (stops[i + 1][k] - a)));
}
const ramp = (stops, x) => `rgb(${rgb(stops, x).join(',')})`;
function colourBar(stops, low, high, caption) {  // a gradient with its end values and what it measures
  const bar = el('div', 'colourbar'), c = el('canvas');
  c.width = 200; c.height = 12; const ctx = c.getContext('2d');
  for (let x = 0; x < 200; x++) { ctx.fillStyle = ramp(stops, x / 199); ctx.fillRect(x, 0, 1, 12); }
  bar.append(el('span', 'end', low), c, el('span', 'end', high), el('span', 'note', caption));
  return bar;
}
const fmt = v => v.toFixed(v !== 0 && Math.abs(v) < 0.01 ? 4 : 3);
// ---- token shading ------------------------------------------------------------------------------------------------
function meanDrop(f, m) {  // AOPC: the mean drop of p(predicted class) with the method's top k tokens → [UNK]
  const d = (f.deletion[m] || []).filter(x => x !== null);
  return d.length ? d.reduce((a, b) => a + b, 0) / d.length : null;
}
function pageDrops() {  // each method's AOPC averaged over this page's texts
  const drops = {};
  [...STATE.methods, 'random'].forEach(m => {
    const v = STATE.texts.filter(t => t.faithfulness && t.scores && (m === 'random' || t.scores[m]))
      .map(t => meanDrop(t.faithfulness, m)).filter(x => x !== null);
    if (v.length) drops[m] = v.reduce((a, b) => a + b, 0) / v.length;
  });
  return drops;
}
function mostFaithful() {  // the default shading: the method whose top tokens, taken away, lower p(class) most
  const drops = pageDrops();
  return STATE.methods.filter(m => m in drops).sort((a, b) => drops[b] - drops[a])[0];
}
function paintTokens() {
  document.querySelectorAll('#switch button').forEach(b => b.classList.toggle('active', b.dataset.method === method));
  const signed = STATE.signed.includes(method), drops = pageDrops();
  const legend = document.getElementById('legend');
  legend.replaceChildren(signed
    ? colourBar(PURPLE_ORANGE, '−top', '+top', 'orange: the token supports the predicted class, purple: it speaks ' +
                'against it; top = the largest |score| of this method in the text')
    : colourBar(BLUES, '0', 'top', 'weight the token gets (never negative: where the model looked, not for or ' +
                'against the class); top = the largest score of this method in the text'));
  if (method in drops) {
    const others = Object.entries(drops).filter(([m]) => m !== method)
      .map(([m, d]) => `${STATE.titles[m] || m} ${d.toFixed(3)}`);
    legend.appendChild(el('p', 'note', `${chosen ? 'Shown' : 'Shown by default, the most faithful on this page'}: ` +
      `${STATE.titles[method]} — replacing its top 1–5 tokens by [UNK] lowers p(predicted class) by ` +
      `${drops[method].toFixed(3)} on average (${others.join(', ')}).`));
  }
  STATE.texts.forEach((t, i) => {
    if (!t.scores) return;
    const s = t.scores[method], top = s ? Math.max(...s.map(Math.abs)) : 0;
    document.querySelectorAll(`#text${i} .tok`).forEach((e, j) => {
      const x = s && top > 0 ? s[j] / top : 0;
      e.style.backgroundColor = !s ? 'transparent' : signed ? ramp(PURPLE_ORANGE, 0.5 + x / 2) : ramp(BLUES, x);
      e.style.color = Math.abs(x) > 0.65 ? '#fff' : '';
      e.title = s ? `${method}: ${s[j].toFixed(4)}` : `${method}: not applicable`;
    });
    document.querySelector(`#text${i} .method-note`).textContent = t.notes[method] || '';
  });
}
// ---- attention maps: one colour scale for every head of a text -----------------------------------------------------
function cells(m, top) {  // the map at one pixel per cell, on the scale 0..top
  const n = m.length, k = m[0].length, image = new ImageData(k, n), small = el('canvas');
  for (let i = 0; i < n; i++) for (let j = 0; j < k; j++) {
    image.data.set([...rgb(VIRIDIS, m[i][j] / top), 255], 4 * (i * k + j));
  }
  small.width = k; small.height = n; small.getContext('2d').putImageData(image, 0, 0);
  return small;
}
function drawMap(canvas, m, cell, top, hover) {
  const ctx = canvas.getContext('2d'), n = m.length, k = m[0].length;
  if (canvas.scaleTop !== top) { canvas.cells = cells(m, top); canvas.scaleTop = top; }  // hovering only redraws
  ctx.imageSmoothingEnabled = false; ctx.drawImage(canvas.cells, 0, 0, k * cell, n * cell);
  ctx.strokeStyle = '#f22'; ctx.lineWidth = 2;
  if (hover.row !== null && hover.row < n) ctx.strokeRect(1, hover.row * cell + 1, k * cell - 2, cell - 2);
  if (hover.col !== null && hover.col < k) ctx.strokeRect(hover.col * cell + 1, 1, cell - 2, n * cell - 2);
}
// A token is named on an axis: all up to 60 tokens, else every few, and the hovered one always.
function shown(n, j, hovered) {
  return j === hovered || n <= LABEL_EVERY_TOKEN || j % Math.ceil(n / LABEL_EVERY_TOKEN) === 0;
}
function drawAxis(canvas, tokens, cell, hovered, vertical) {
  const ctx = canvas.getContext('2d'), n = tokens.length;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  tokens.forEach((tok, j) => {
    if (!shown(n, j, hovered)) return;
    const name = tok.length > 10 ? tok.slice(0, 9) + '…' : tok;
    ctx.font = `${j === hovered ? 'bold ' : ''}${Math.min(12, Math.max(8, cell - 1))}px sans-serif`;
    ctx.fillStyle = j === hovered ? '#d00' : '#333'; ctx.textBaseline = 'middle';
    if (vertical) {  // key tokens above the columns, read bottom to top
      ctx.save(); ctx.translate(j * cell + cell / 2, canvas.height - 2); ctx.rotate(-Math.PI / 2);
      ctx.textAlign = 'left'; ctx.fillText(name, 0, 0); ctx.restore();
    } else { ctx.textAlign = 'right'; ctx.fillText(name, canvas.width - 3, j * cell + cell / 2); }
  });
}
function redraw(i, hover) {
  const t = STATE.texts[i];
  document.querySelectorAll(`#text${i} .map`).forEach(box => {
    const heat = box.querySelector('canvas.heat'), [l, h] = [+heat.dataset.layer, +heat.dataset.head];
    const m = t.attention[l][h], own = box.querySelector('input.stretch').checked;
    drawMap(heat, m, +heat.dataset.cell, own ? Math.max(1e-9, ...m.map(r => Math.max(...r))) : t.top, hover);
    drawAxis(box.querySelector('canvas.rows'), t.tokens, +heat.dataset.cell, hover.row, false);
    drawAxis(box.querySelector('canvas.cols'), t.tokens, +heat.dataset.cell, hover.col, true);
    heat.dataset.row = hover.row === null ? '' : hover.row;
  });
}
function highlight(i, row, col = null, where = null) {
  const t = STATE.texts[i];
  document.querySelectorAll(`#text${i} .tok`).forEach((e, j) => e.classList.toggle('hl', j === row));
  const info = document.querySelector(`#text${i} .hover`);
  if (!t.attention) return;
  redraw(i, {row, col});
  if (row === null) { info.textContent = ''; return; }
  if (where !== null && col !== null) {
    const w = t.attention[where[0]][where[1]][row][col];
    info.textContent = `layer ${where[0]} head ${where[1]}: query "${t.tokens[row]}" → key "${t.tokens[col]}": ` +
      fmt(w);
    return;
  }
  const parts = t.attention.map((layer, l) => {
    const avg = layer[0][0].map((_, j) => layer.reduce((s, hm) => s + hm[row][j], 0) / layer.length);
    const best = avg.map((v, j) => [v, j]).sort((a, b) => b[0] - a[0]).slice(0, 3);
    return `layer ${l}: ` + best.map(([v, j]) => `${t.tokens[j]} ${v.toFixed(2)}`).join(', ');
  });
  info.textContent = `query "${t.tokens[row]}" looks at (mean of heads) — ` + parts.join(' | ');
}
// ---- the attention doctor's verdicts ------------------------------------------------------------------------------
function findingLine(f) {
  const figures = Object.entries(f.figures || {}).map(([k, v]) => `${k} ${v === null ? 'n/a' : fmt(v)}`).join(', ');
  return `${f.verdict} (${f.severity}${f.head === null && f.layer !== null ? ', the whole layer' : ''})` +
    (figures ? `: ${figures}` : '') + (f.detail ? `\n${f.detail}` : '') + (f.cause ? `\ncause: ${f.cause}` : '') + (f.fix ? `\ntry: ${f.fix}` : '');
}
function badge(findings) {  // findings: those of one head, or null when the checkpoint holds none
  const v = STATE.verdicts, b = el('span', 'badge');
  if (!v) {
    b.classList.add('unexamined'); b.textContent = 'not examined';
    b.title = 'the checkpoint holds no verdicts of the attention doctor (trained without its AttentionMonitor)';
    return b;
  }
  const when = `the attention monitor, validation of epoch ${v.epoch} (step ${v.step})`;
  const warnings = findings.filter(f => f.severity === 'warning');
  const shownFindings = warnings.length ? warnings : findings;
  b.classList.add(warnings.length ? 'warning' : findings.length ? 'note' : 'ok');
  b.textContent = shownFindings.length ? [...new Set(shownFindings.map(f => f.verdict))].join(', ') : 'ok';
  b.title = (findings.length ? findings.map(findingLine).join('\n\n') : 'no finding: every check passed') +
    `\n\n— ${when}`;
  return b;
}
function headFindings(l, h) {  // a head's own findings and those of its whole layer
  if (!STATE.verdicts) return null;
  return STATE.verdicts.findings.filter(f => f.layer === l && (f.head === null || f.head === h));
}
function modelVerdicts() {
  const line = el('p', 'note verdicts');
  if (!STATE.verdicts) { line.append('Verdicts: ', badge(null)); return line; }
  const whole = STATE.verdicts.findings.filter(f => f.layer === null);
  line.append(`Verdicts of the attention doctor (its last validation in training, epoch ${STATE.verdicts.epoch}), ` +
              'hover a badge for the figures behind it; the whole model: ', badge(whole));
  return line;
}
// ---- faithfulness -------------------------------------------------------------------------------------------------
const COLUMNS = [
  ['Spearman with occlusion', 'rank agreement of the method\'s token scores with exact occlusion: 1 = the same ' +
   'order, ' +
   '0 = unrelated (occlusion itself is the reference)'],
  ['drop k=N', 'p(predicted class) minus p(predicted class) with the method\'s top N tokens replaced by [UNK]: the ' +
   'larger, the more those tokens mattered; "random" (random orders, averaged) is the floor'],
  ['mean drop', 'the mean of the drops over k (AOPC); the page shades tokens by default with the method whose mean ' +
   'drop, over the texts on the page, is largest'],
];
function faithfulnessTable(f) {
  const table = el('table', 'faith'), head = el('tr');
  const names = ['method', COLUMNS[0][0], ...f.ks.map(k => `drop k=${k}`), 'mean drop'];
  const what = [null, COLUMNS[0], ...f.ks.map(() => COLUMNS[1]), COLUMNS[2]];
  names.forEach((h, c) => { const th = el('th', '', h); if (what[c]) th.title = what[c][1]; head.appendChild(th); });
  table.appendChild(head);
  Object.entries(f.deletion).forEach(([m, drops]) => {
    const tr = el('tr'), name = el('th', '', STATE.titles[m] || m), r = f.spearman[m], mean = meanDrop(f, m);
    name.style.textAlign = 'left'; tr.appendChild(name);
    tr.appendChild(el('td', '', r === null || r === undefined ? '—' : r.toFixed(2)));
    drops.forEach(d => tr.appendChild(el('td', '', d === null ? '—' : d.toFixed(3))));
    tr.appendChild(el('td', '', mean === null ? '—' : mean.toFixed(3)));
    table.appendChild(tr);
  });
  const legend = el('ul', 'note columns');
  COLUMNS.forEach(([name, what]) => {
    const li = el('li'); li.append(el('b', '', name), `: ${what}`); legend.appendChild(li);
  });
  return [table, legend];
}
// ---- one card per text --------------------------------------------------------------------------------------------
function mapBox(t, i, l, h, cell) {
  const n = t.tokens.length, m = t.attention[l][h], box = el('div', 'map');
  const title = el('div', 'map-title', `layer ${l} · head ${h} `); title.appendChild(badge(headFindings(l, h)));
  const grid = el('div', 'map-grid'), heat = el('canvas', 'heat');
  const rows = el('canvas', 'rows'), cols = el('canvas', 'cols');
  heat.width = cols.width = m[0].length * cell; heat.height = rows.height = m.length * cell;
  rows.width = cols.height = Math.min(80, 8 + 6.5 * Math.max(...t.tokens.map(x => Math.min(10, x.length))));
  Object.assign(heat.dataset, {layer: l, head: h, cell: cell, row: ''});
  const at = e => [Math.min(n - 1, Math.floor(e.offsetY / cell)),
                   Math.min(m[0].length - 1, Math.floor(e.offsetX / cell))];
  heat.onmousemove = e => { const [r, c] = at(e); highlight(i, r, c, [l, h]); };
  heat.onmouseleave = () => highlight(i, null);
  grid.append(el('span'), cols, rows, heat);
  const stretch = el('label', 'note stretch-label'), check = el('input', 'stretch'), own = el('span', 'own');
  check.type = 'checkbox';
  check.onchange = () => {
    box.classList.toggle('stretched', check.checked);
    own.textContent = check.checked ? ` (now 0–${fmt(Math.max(...m.map(r => Math.max(...r))))}: not comparable)` : '';
    redraw(i, {row: null, col: null});
  };
  stretch.append(check, ' contrast: own scale', own);
  stretch.title = 'stretch this map to its own largest weight (0 to its max), no longer comparable with the others';
  box.append(title, grid, stretch);
  return box;
}
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
  details.append(...faithfulnessTable(t.faithfulness)); box.appendChild(details);
  box.appendChild(el('h3', '', 'attention per layer and head (query rows × key columns)'));
  t.tokens.forEach((tok, j) => {
    const e = el('span', 'tok', tok);
    e.onmouseenter = () => highlight(i, j); e.onmouseleave = () => highlight(i, null); toks.appendChild(e);
  });
  if (!t.attention) {
    box.append(el('div', 'hover note'),
               el('div', 'maps', t.notes.attention || 'no token × token attention for this model'));
    return box;
  }
  t.top = t.attention.flat(3).reduce((a, b) => Math.max(a, b), 1e-9);  // the one scale: the largest weight of any head
  box.appendChild(colourBar(VIRIDIS, '0', fmt(t.top), 'attention weight, one scale for every map of this text: 0 to ' +
    'the largest weight of any head; a map switched to its own contrast says so under it'));
  box.appendChild(modelVerdicts());
  box.appendChild(el('div', 'hover note')); const maps = el('div', 'maps'); box.appendChild(maps);
  const n = t.tokens.length;
  const cell = n <= LABEL_EVERY_TOKEN ? Math.max(9, Math.min(20, Math.floor(MAP_WIDTH / n)))
                                      : Math.max(3, Math.floor(540 / n));
  t.attention.forEach((layer, l) => {  // a row per layer
    const row = el('div', 'layer');
    layer.forEach((_, h) => row.appendChild(mapBox(t, i, l, h, cell)));
    maps.appendChild(row);
  });
  return box;
}
function show(data) {
  Object.assign(STATE, data);
  const sw = document.getElementById('switch');
  if (!sw.childElementCount) STATE.methods.forEach(m => {
    const b = el('button', '', STATE.titles[m]); b.dataset.method = m; b.type = 'button';
    b.onclick = () => { method = m; chosen = true; paintTokens(); }; sw.appendChild(b);
  });
  if (!chosen) method = mostFaithful() || STATE.methods.find(m => STATE.texts.some(t => t.scores && t.scores[m])) ||
    STATE.methods[0];
  document.getElementById('cards').replaceChildren(...STATE.texts.map(card));
  STATE.texts.forEach((t, i) => t.attention && redraw(i, {row: null, col: null}));
  paintTokens();
}
const PAGE = JSON.parse(document.getElementById('data').textContent);
show(PAGE);
