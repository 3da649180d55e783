// corpus-io explore: the page. Vanilla JS, no network access beyond this server's /api.
"use strict";
const $ = (id) => document.getElementById(id);
const state = { seq: 0, page: 0, size: 50, sort: "row_id", desc: false, total: 0, filters: {}, open: null, runs: 0,
  kind: "shard", scored: false };
const COLUMNS = [
  ["row_id", "#", "num"], ["key", "key"], ["duration", "dur (s)", "num"], ["text", "text"],
  ["speaker", "speaker"], ["shard", "shard"], ["chars", "chars", "num"], ["cps", "chars/s", "num"],
  ["text_count", "same text", "num"],
];
const AUDIO_COLUMN = ["source", "audio"];  // a raw list or Kaldi dir has one pseudo-shard: show each file instead
const RUN_COLUMNS = [["cer", "CER", "num"], ["wer", "WER", "num"], ["hyp", "hypothesis"]];
const CMP_COLUMNS = [["cer2", "CER 2", "num"], ["cer_delta", "CER \u0394", "num"]];
// corpus-io score's figures (++scores): each column sorts; the filter form's figure select filters any of them
const SCORE_COLUMNS = [["score_flagged", "flagged"], ["score_loss_per_token", "loss/token", "num"],
  ["score_loss_per_frame", "loss/frame", "num"], ["score_cer", "label CER", "num"], ["score_wer", "label WER", "num"],
  ["score_tokens_per_second", "tokens/s", "num"], ["score_chars_per_second", "label chars/s", "num"],
  ["score_reasons", "reasons"]];
const SCORE_NUMBERS = SCORE_COLUMNS.filter((c) => c[2] === "num").map((c) => c[0]);

async function api(path) {
  const r = await fetch(path);
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}
function esc(s) { return String(s ?? "").replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c])); }
function fmt(v, digits = 2) { return v === null || v === undefined ? "" : typeof v === "number" && !Number.isInteger(v) ? v.toFixed(digits) : String(v); }
function base(url) { return url ? String(url).split("/").pop() : ""; }

function columns() {
  let cols = COLUMNS.map((col) => (col[0] === "shard" && state.kind !== "shard" ? AUDIO_COLUMN : col));
  if (state.runs >= 1) cols = cols.concat(RUN_COLUMNS);
  if (state.runs >= 2) cols = cols.concat(CMP_COLUMNS);
  if (state.scored) cols = cols.concat(SCORE_COLUMNS);
  return cols;
}

function renderHead() {
  $("head").innerHTML = columns().map(([c, label]) =>
    `<th data-col="${c}" class="${state.sort === c ? "sorted" + (state.desc ? " desc" : "") : ""}">${esc(label)}</th>`).join("");
  for (const th of $("head").children) {
    th.onclick = () => {
      const col = { hyp: "cer", source: "row_id", score_reasons: "score_flagged" }[th.dataset.col] || th.dataset.col;  // files sort in list order
      if (state.sort === col) state.desc = !state.desc; else { state.sort = col; state.desc = false; }
      state.page = 0; load();
    };
  }
}

function query(extra = {}) {
  const p = new URLSearchParams({ page: state.page, size: state.size, sort: state.sort, desc: state.desc ? 1 : 0 });
  for (const [k, v] of Object.entries({ ...state.filters, ...extra })) if (v !== "") p.set(k, v);
  return p.toString();
}

async function load() {
  document.body.dataset.busy = "1";  // "0" once the rows on screen answer the current sort and filters
  const seq = ++state.seq;  // only the latest request draws: an older answer arriving late is dropped
  renderHead();
  $("status").textContent = "loading\u2026";
  const t0 = performance.now();
  let data;
  try { data = await api("/api/rows?" + query()); if (seq !== state.seq) return; }
  catch (e) { $("status").textContent = "error: " + e.message; $("status").className = "error"; document.body.dataset.busy = "0"; return; }
  $("status").className = "muted";
  state.total = data.total;
  const pages = Math.max(1, Math.ceil(data.total / state.size));
  $("pageinfo").textContent = `page ${state.page + 1} of ${pages} \u00b7 ${data.total} rows`;
  $("status").textContent = `${data.total} utterances match (${Math.round(performance.now() - t0)} ms)`;
  $("prev").disabled = state.page === 0;
  $("next").disabled = state.page + 1 >= pages;
  $("body").innerHTML = data.rows.map((r) => `<tr data-row="${r.row_id}" class="${r.error ? "bad" : ""}${r.row_id === state.open ? " open" : ""}">` +
    columns().map(([c, , cls]) => {
      let v = c === "shard" || c === "source" ? base(r[c]) : r[c];
      if (c === "duration") v = fmt(v, 2);
      else if (["cps", "cer", "wer", "cer2", "cer_delta"].includes(c) || SCORE_NUMBERS.includes(c)) v = fmt(v, 3);
      else if (c === "score_flagged") v = v === null || v === undefined ? "" : v ? "yes" : "no";
      return `<td class="${cls || ""}" title="${esc(r[c] ?? "")}">${esc(v)}</td>`;
    }).join("") + "</tr>").join("");
  for (const tr of $("body").children) tr.onclick = () => openRow(Number(tr.dataset.row));
  document.body.dataset.busy = "0";
}

function diffHtml(ops) {
  return ops.map(([op, r, h]) => op === "=" ? `<span>${esc(r)}</span>` :
    op === "S" ? `<span class="S" title="substitution: ${esc(r)} \u2192 ${esc(h)}">${esc(h)}</span>` :
    op === "I" ? `<span class="I" title="insertion">${esc(h)}</span>` :
    `<span class="D" title="deletion">${esc(r)}</span>`).join(" ");
}

function runBlock(title, row, sfx, diff) {
  if (!diff) return "";
  const c = diff.counts;
  return `<h3>${title}</h3><div class="muted small">CER ${fmt(row["cer" + sfx], 3)} \u00b7 WER ${fmt(row["wer" + sfx], 3)} \u00b7 ` +
    `word match rate ${fmt(row["wmr" + sfx], 3)} \u00b7 <span class="diff"><span class="S">S ${c.S}</span><span class="I">I ${c.I}</span>` +
    `<span class="D">D ${c.D}</span></span></div><div class="diff" data-run="${sfx || 1}">${diffHtml(diff.words)}</div>`;
}

async function openRow(id) {
  state.open = id;
  for (const tr of $("body").children) tr.classList.toggle("open", Number(tr.dataset.row) === id);
  const view = $("rowview");
  view.hidden = false;
  let r;
  try { r = await api(`/api/row/${id}`); }
  catch (e) { $("row-error").hidden = false; $("row-error").textContent = e.message; return; }
  view.dataset.row = id;
  $("row-key").textContent = r.key;
  $("row-where").textContent = r.shard ? `${r.shard} \u00b7 ${r.member || ""} @ ${r.audio_offset ?? "?"} (${r.audio_size ?? "?"} bytes)` : (r.source || "");
  $("row-text").textContent = r.text;
  const err = r.error || r.audio_error;
  $("row-error").hidden = !err;
  $("row-error").textContent = err || "";
  const player = $("player");
  const wave = $("wave").getContext("2d");
  wave.clearRect(0, 0, 800, 90);
  if (!err) {
    player.src = `/api/audio/${id}`;
    $("spec").src = `/api/spectrogram/${id}.png`;
    $("spec").hidden = false;
    drawWave(id);
  } else {
    player.removeAttribute("src"); player.load();
    $("spec").hidden = true;
  }
  $("row-diff").innerHTML = runBlock("Reference vs hypothesis", r, "", r.diff) + runBlock("Run 2", r, "2", r.diff2);
  const meta = { duration: fmt(r.duration, 3) + " s", sample_rate: r.sample_rate, speaker: r.speaker, characters: r.chars,
    words: r.words, "chars/s": fmt(r.cps, 2), "rows with this text": r.text_count, format: r.audio_format,
    playing: r.audio_dumped ? "the dumped waveform (++dump_audio_dir: after augmentation)" : undefined,
    "score: flagged": r.score_flagged === null || r.score_flagged === undefined ? undefined : (r.score_flagged ? "yes" : "no"),
    "score: reasons": r.score_reasons, "score: hypothesis": r.score_hyp, "score: loss/token": fmt(r.score_loss_per_token, 3),
    "score: loss/frame": fmt(r.score_loss_per_frame, 4), "score: label CER": fmt(r.score_cer, 3),
    "score: tokens/s": fmt(r.score_tokens_per_second, 2), ...r.extra };
  $("row-meta").innerHTML = Object.entries(meta).filter(([, v]) => v !== null && v !== undefined && v !== "")
    .map(([k, v]) => `<tr><th>${esc(k)}</th><td>${esc(typeof v === "object" ? JSON.stringify(v) : v)}</td></tr>`).join("");
}

async function drawWave(id) {
  const canvas = $("wave"), ctx = canvas.getContext("2d");
  let w;
  try { w = await api(`/api/waveform/${id}?width=${canvas.width}`); } catch (e) { return; }
  if (state.open !== id) return;
  ctx.fillStyle = "#0f1b2d"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.strokeStyle = "#7fc8f8";
  const mid = canvas.height / 2, scale = w.peaks.length / canvas.width;
  ctx.beginPath();
  for (let x = 0; x < canvas.width; x++) {
    const p = w.peaks[Math.min(w.peaks.length - 1, Math.floor(x * scale))];
    if (!p) continue;
    ctx.moveTo(x + 0.5, mid - p[1] * mid); ctx.lineTo(x + 0.5, mid - p[0] * mid + 1);
  }
  ctx.stroke();
  canvas.dataset.drawn = "1";
}

function barChart(canvas, hist, color = "#4878a8") {
  const ctx = canvas.getContext("2d"), W = canvas.width, H = canvas.height, pad = 22;
  ctx.clearRect(0, 0, W, H);
  if (!hist.counts.length) return;
  const top = Math.max(...hist.counts), bw = (W - pad) / hist.counts.length;
  ctx.fillStyle = color;
  hist.counts.forEach((c, i) => { const h = (H - pad) * c / top; ctx.fillRect(pad + i * bw, H - pad - h, Math.max(1, bw - 1), h); });
  ctx.fillStyle = "#333"; ctx.font = "11px sans-serif";
  ctx.fillText(fmt(hist.edges[0], 2), pad, H - 6);
  const last = fmt(hist.edges[hist.edges.length - 1], 2);  // 1 digit rounded a largest CER of 1.04 down to 1.0
  ctx.fillText(last, W - ctx.measureText(last).width - 2, H - 6);
  ctx.fillText(String(top), 0, 12);
}

async function loadDataset() {
  const d = await api("/api/dataset");
  const cards = { utterances: d.utterances, hours: fmt(d.hours, 3), speakers: d.speakers ?? "-", shards: d.shards ? d.shards.length : "-",
    "duplicate-text rows": d.duplicate_text_rows, "empty text": d.empty_text, unreadable: d.errors, "distinct words": d.num_words };
  if (d.run1) { cards["CER run 1"] = fmt(100 * d.run1.cer, 2) + " %"; cards["WER run 1"] = fmt(100 * d.run1.wer, 2) + " %"; }
  if (d.run2) { cards["CER run 2"] = fmt(100 * d.run2.cer, 2) + " %"; }
  if (d.compare) { cards["better in run 2"] = d.compare.better; cards["worse in run 2"] = d.compare.worse; }
  if (d.score) { cards["scored"] = d.score.scored; cards["flagged by score"] = d.score.flagged; }
  $("totals").innerHTML = Object.entries(cards).map(([k, v]) => `<div class="card"><b>${esc(v)}</b>${esc(k)}</div>`).join("");
  for (const col of ["duration", "cps", "chars"].concat(state.runs ? ["cer"] : [])) {
    api(`/api/hist?column=${col}&bins=40`).then((h) => barChart($("h-" + col), h));
  }
  $("alphabet").innerHTML = (d.alphabet || []).map(([c, n]) => `<span>${esc(c)}<small>${n}</small></span>`).join("");
  $("vocab-count").textContent = d.num_words !== undefined ? `(${d.num_words} distinct, ${d.word_tokens} tokens; top 200)` : "";
  const vtop = (d.vocabulary || []).slice(0, 200), vmax = vtop.length ? vtop[0][1] : 1;
  $("vocab").innerHTML = vtop.map(([w, n]) => `<tr><td>${esc(w)}</td><td class="num">${n}</td><td><span class="bar" style="width:${Math.round(120 * n / vmax)}px"></span></td></tr>`).join("");
  if (d.missing_tokens) {
    $("missing-box").hidden = false;
    $("missing").innerHTML = d.missing_tokens.length ? d.missing_tokens.map(([c, n]) => `<span>${esc(c)}<small>${n}</small></span>`).join("") : "none";
  }
  const acc = (d.run1 && d.run1.word_accuracy) || [];
  $("wordacc").innerHTML = "<tr><th>word</th><th>in refs</th><th>accuracy</th><th></th></tr>" + acc.slice(0, 200).map(([w, n, hit]) =>
    `<tr><td>${esc(w)}</td><td class="num">${n}</td><td class="num">${fmt(100 * hit / n, 1)} %</td>` +
    `<td><span class="bar" style="width:${Math.round(100 * hit / n)}px"></span></td></tr>`).join("");
  const shards = d.shards || [], smax = Math.max(1e-9, ...shards.map((s) => s.hours));
  $("shards").innerHTML = "<tr><th>shard</th><th>utts</th><th>hours</th><th></th></tr>" + shards.slice(0, 500).map((s) =>
    `<tr class="${s.error ? "bad" : ""}" title="${esc(s.error || s.url)}"><td>${esc(base(s.url))}</td><td class="num">${s.utterances}</td>` +
    `<td class="num">${fmt(s.hours, 4)}</td><td>${s.error ? "unreadable" : `<span class="bar" style="width:${Math.round(120 * s.hours / smax)}px"></span>`}</td></tr>`).join("");
}

function readFilters() {
  state.filters = {};
  for (const el of $("filters").elements) if (el.name && el.value !== "") state.filters[el.name] = el.value;
  const fig = $("f-score-fig").value;  // one figure of score at a time: <figure>_min / <figure>_max
  if (fig && $("f-score-min").value !== "") state.filters[fig + "_min"] = $("f-score-min").value;
  if (fig && $("f-score-max").value !== "") state.filters[fig + "_max"] = $("f-score-max").value;
}

async function init() {
  const d = await api("/api/info");  // cheap: the totals of the dataset view come later, off the first paint
  state.runs = d.runs.length;
  state.kind = d.kind;
  $("f-shard").closest("label").hidden = d.kind !== "shard";
  document.body.classList.toggle("has-runs", state.runs > 0);
  for (const el of document.querySelectorAll(".run-only")) el.hidden = state.runs === 0;
  for (const el of document.querySelectorAll(".cmp-only")) el.hidden = state.runs < 2;
  state.scored = Boolean(d.scores);
  for (const el of document.querySelectorAll(".score-only")) el.hidden = !state.scored;
  $("f-score-fig").innerHTML = SCORE_COLUMNS.filter((c) => c[2] === "num")
    .map(([c, label]) => `<option value="${c}">${esc(label)}</option>`).join("");
  $("summary").textContent = `${d.input} \u00b7 ${d.utterances} utterances`;
  api("/api/dataset").then((t) => {
    $("summary").textContent = `${t.input} \u00b7 ${t.utterances} utterances \u00b7 ${fmt(t.hours, 2)} h` +
      (t.speakers == null ? "" : ` \u00b7 ${t.speakers} speakers`);
  }).catch(() => {});
  const sel = $("f-shard");
  (d.shards || []).slice(0, 5000).forEach((s) => { const o = document.createElement("option"); o.value = s.id; o.textContent = base(s.url); sel.appendChild(o); });
  $("filters").onsubmit = (e) => { e.preventDefault(); readFilters(); state.page = 0; load(); };
  $("clear").onclick = () => { HTMLFormElement.prototype.reset.call($("filters")); readFilters(); state.page = 0; load(); };
  $("prev").onclick = () => { state.page = Math.max(0, state.page - 1); load(); };
  $("next").onclick = () => { state.page += 1; load(); };
  $("size").onchange = () => { state.size = Number($("size").value); state.page = 0; load(); };
  $("tab-table").onclick = () => switchTab("table");
  $("tab-dataset").onclick = () => switchTab("dataset");
  await load();
  document.body.dataset.ready = "1";
}

function switchTab(name) {
  $("view-table").hidden = name !== "table";
  $("view-dataset").hidden = name !== "dataset";
  $("tab-table").classList.toggle("active", name === "table");
  $("tab-dataset").classList.toggle("active", name === "dataset");
  if (name === "dataset") loadDataset().then(() => { document.body.dataset.dataset = "1"; });
}

init().catch((e) => { $("status").textContent = "error: " + e.message; $("status").className = "error"; });
