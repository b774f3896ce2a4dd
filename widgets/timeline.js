// nbtoolkit timeline widget: lanes of a Trace, or a stacked memory timeline, drawn on a canvas.
//
// The browser never holds the events. On every zoom or pan it asks the kernel for one screen
// ({type: "view", t0, t1, width}); the kernel answers with a few rectangles per pixel and lane
// in binary buffers (nbtoolkit/timeline/widget.py documents the columns). Until the answer
// arrives, the previous screen is redrawn under the new zoom, so the page reacts at once.
// Every text from the trace goes into the page through textContent, never as HTML.
// Times here are µs from the trace's origin (never epoch µs: a float64 of 1.69e15 µs resolves
// 0.25 µs); the deepest zoom is a 1 ns window. A rank's header folds its lanes into one.

const KIND_COLOURS = {
  compute: "#4C78A8",
  communication: "#E45756",
  memory: "#54A24B",
  other: "#9D9D9D",
  host: "#72B7B2",
};
const CATEGORY_COLOURS = {
  parameter: "#4C78A8",
  optimizer_state: "#F58518",
  input: "#B279A2",
  temporary: "#EECA3B",
  activation: "#54A24B",
  gradient: "#E45756",
  autograd_detail: "#72B7B2",
  unknown: "#BAB0AC",
};
const LANE_HEIGHT = 22;
const MEMORY_HEIGHT = 260;
const AXIS_HEIGHT = 22;
const MAX_ROWS = 20;
const MIN_ROWS = 3; // a trace of one lane still leaves its tooltip room // rows shown before the lanes scroll (timeline_widget.MAX_PLOT_ROWS)
const MIN_WINDOW_US = 1e-3; // the deepest zoom: 1 ns (timeline_lod.MIN_WINDOW_US)
const DTYPES = {
  e_lane: Uint16Array, e_start: Float64Array, e_dur: Float64Array, e_row: Int32Array,
  e_kind: Uint8Array, e_name: Uint32Array, a_lane: Uint16Array, a_px: Uint16Array,
  a_count: Uint32Array, a_busy: Float32Array, a_row: Int32Array, a_kind: Uint8Array,
  a_name: Uint32Array, max_total: Float64Array, min_total: Float64Array, max_time: Float64Array,
  at_max: Float32Array,
};

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function typed(name, buffer) {
  // Copy: a DataView may start at an offset that the typed array's alignment forbids.
  const view = buffer instanceof DataView ? buffer : new DataView(buffer.buffer || buffer);
  const bytes = view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength);
  return new DTYPES[name](bytes);
}

function formatTime(us) {
  const a = Math.abs(us);
  if (us === 0) return "0 µs";
  if (a >= 1e6) return (us / 1e6).toFixed(3) + " s";
  if (a >= 1e3) return (us / 1e3).toFixed(3) + " ms";
  if (a >= 1) return us.toFixed(2) + " µs";
  const ns = us * 1e3; // the 1 ns limit reads "1.0 ns" even a rounding error below it
  return (Math.abs(ns) >= 0.95 || ns === 0 ? ns.toFixed(1) : ns.toPrecision(2)) + " ns";
}

// ---------------------------------------------------------------- time axis
// Ticks at a "nice" step (1, 2 or 5 × 10^k µs), about one per 90 px; the decimals of every label
// come from the step, so two ticks never read the same at any zoom. Where the window is narrow
// next to its distance from the origin (more than 5 digits between them), labels become offsets
// ("+20 ns") from the first tick, which is written once at the axis' left ("4.012345678 s +"),
// as profilers do.
const UNITS = [[1e6, "s"], [1e3, "ms"], [1, "µs"], [1e-3, "ns"]];

function niceStep(raw) {
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

function unitFor(us) {
  for (const [f, u] of UNITS) if (Math.abs(us) >= f) return [f, u];
  return UNITS[UNITS.length - 1];
}

function decimalsFor(step, f) {
  return Math.min(12, Math.max(0, Math.ceil(-Math.log10(step / f) - 1e-9)));
}

function formatAt(us, resolution) {
  // A time written to ``resolution`` µs (the unit chosen by the time itself).
  const [f, u] = unitFor(us === 0 ? resolution : us);
  return (us / f).toFixed(decimalsFor(resolution, f)) + " " + u;
}

function axisTicks(t0, t1, w) {
  const target = Math.max(2, Math.floor(w / 75));
  const step = niceStep(Math.max((t1 - t0) / target, 1e-7));
  const k0 = Math.ceil(t0 / step - 1e-9);
  const times = [];
  for (let k = k0; times.length < 200; k++) {
    const t = k * step;
    if (t > t1 + step * 1e-9) break;
    times.push(Math.abs(t) < step * 1e-6 ? 0 : t);
  }
  const mag = Math.max(Math.abs(t0), Math.abs(t1));
  if (mag / step <= 1e5) {
    const [f, u] = unitFor(mag || step);
    const dec = decimalsFor(step, f);
    return { base: null, step, times, labels: times.map((t) => (t / f).toFixed(dec) + " " + u) };
  }
  const base = times.length ? times[0] : k0 * step;
  const [f, u] = unitFor(step);
  const dec = decimalsFor(step, f);
  return {
    base: formatAt(base, step) + " +",
    step,
    times,
    labels: times.map((t) => "+" + ((t - base) / f).toFixed(dec) + " " + u),
  };
}

function formatBytes(b) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = b, i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(2)) + " " + units[i];
}

function render({ model, el: host }) {
  const kind = model.get("kind");
  const client = Math.random().toString(36).slice(2);
  const names = new Map(); // name id -> text, filled from the kernel's answers
  const stats = { draws: [], roundtrips: [], views: 0, bytes: [], ticks: [], axisBase: null, errors: [] };

  const root = el("div", "nbt-timeline");
  root.__nbtStats = stats;
  const header = el("div", "nbt-tl-header");
  const title = el("span", "nbt-tl-title", model.get("title"));
  const status = el("span", "nbt-tl-status", "loading…");
  const reset = el("button", "nbt-tl-reset", "reset zoom");
  header.append(title, status, reset);
  // The lanes scroll (past MAX_ROWS rows); the time axis stays at the bottom (sticky).
  const body = el("div", "nbt-tl-body");
  const scroller = el("div", "nbt-tl-scroll");
  const grid = el("div", "nbt-tl-grid");
  const labels = el("div", "nbt-tl-labels");
  const stage = el("div", "nbt-tl-stage");
  const canvas = el("canvas", "nbt-tl-canvas");
  const axisSpacer = el("div", "nbt-tl-axis-spacer");
  const axisCanvas = el("canvas", "nbt-tl-axis");
  stage.append(canvas);
  grid.append(labels, stage, axisSpacer, axisCanvas);
  scroller.append(grid);
  body.append(scroller);
  const tip = el("div", "nbt-tl-tip"); // in the root: kept inside the widget's box (showTip)
  tip.style.display = "none";
  const legend = el("div", "nbt-tl-legend");
  const selection = el("div", "nbt-tl-selection");
  root.append(header, body, legend, selection, tip);
  host.append(root);

  const lanes = model.get("lanes");
  const nLanes = lanes.length;
  const ranks = kind === "trace" ? model.get("ranks") || [] : [];
  const rankLanes = kind === "trace" ? model.get("rank_lanes") || [] : [];
  let rows = []; // what is drawn, top to bottom: {id (-1: a header without data), rank, label, type}
  let rowOf = new Map(); // row id -> position
  let plotHeight = MEMORY_HEIGHT;

  function layout() {
    if (kind !== "trace") {
      plotHeight = MEMORY_HEIGHT;
    } else {
      const folded = new Set(model.get("folded") || []);
      rows = [];
      if (!ranks.length) {
        lanes.forEach((label, i) => rows.push({ id: i, rank: null, label, type: "lane" }));
      } else {
        ranks.forEach((rank, i) => {
          const own = rankLanes[i] || [];
          const n = `${own.length} lane${own.length === 1 ? "" : "s"}`;
          if (folded.has(rank)) {
            rows.push({ id: nLanes + i, rank, label: `▸ rank ${rank} · ${n}`, type: "summary" });
          } else {
            rows.push({ id: -1, rank, label: `▾ rank ${rank} · ${n}`, type: "header" });
            for (const lane of own) rows.push({ id: lane, rank, label: lanes[lane], type: "lane" });
          }
        });
      }
      rowOf = new Map();
      rows.forEach((r, i) => { if (r.id >= 0) rowOf.set(r.id, i); });
      plotHeight = Math.max(MIN_ROWS, rows.length) * LANE_HEIGHT; // room for a tooltip
      labels.replaceChildren();
      for (const row of rows) {
        const label = el("div", "nbt-tl-label", row.label);
        if (row.type !== "lane") {
          label.classList.add("nbt-tl-rank");
          label.dataset.rank = String(row.rank);
          label.title = row.type === "summary" ? "click to show this rank's lanes" : "click to fold this rank into one lane";
          label.addEventListener("click", () => toggleRank(row.rank));
        }
        labels.append(label);
      }
    }
    const cap = model.get("height") || MAX_ROWS * LANE_HEIGHT;
    scroller.style.maxHeight = (kind === "trace" ? cap : plotHeight) + AXIS_HEIGHT + 2 + "px";
    stage.style.height = plotHeight + "px";
  }

  function toggleRank(rank) {
    const folded = new Set(model.get("folded") || []);
    if (folded.has(rank)) folded.delete(rank); else folded.add(rank);
    model.set("folded", ranks.filter((r) => folded.has(r)));
    model.save_changes();
    refold();
  }

  function refold() {
    layout();
    draw();
    request(0);
  }

  if (kind === "trace") {
    for (const k of model.get("kinds")) {
      const item = el("span", "nbt-tl-key", k);
      item.style.setProperty("--swatch", KIND_COLOURS[k] || "#888");
      legend.append(item);
    }
  } else {
    labels.style.display = "none";
    axisSpacer.style.display = "none";
    for (const c of model.get("categories")) {
      const item = el("span", "nbt-tl-key", c);
      item.style.setProperty("--swatch", CATEGORY_COLOURS[c] || "#888");
      legend.append(item);
    }
  }
  layout();

  let win = model.get("window").slice();
  const span = model.get("span");
  let data = null; // the latest answer: {t0, t1, width, columns...}
  let nextId = 0, latestId = -1, sentAt = new Map(), timer = null, width = 0;

  function cssWidth() { return Math.max(50, Math.floor(stage.clientWidth || 800)); }

  function request(delay) {
    clearTimeout(timer);
    timer = setTimeout(() => {
      width = cssWidth();
      if (win[0] !== model.get("window")[0] || win[1] !== model.get("window")[1]) {
        model.set("window", win.slice()); // w.window in the notebook: the range on screen
        model.save_changes();
      }
      latestId = nextId++;
      sentAt.set(latestId, performance.now());
      const message = { type: "view", t0: win[0], t1: win[1], width, id: latestId, client };
      if (kind === "trace") message.rows = rows.filter((r) => r.id >= 0).map((r) => r.id);
      model.send(message);
    }, delay);
  }

  function onMessage(msg, buffers) {
    if (!msg || typeof msg !== "object") return;
    if (msg.type === "error") {
      stats.errors.push(String(msg.message));
      status.textContent = "kernel: " + msg.message;
      return;
    }
    if (msg.type !== "view") return;
    for (const [id, text] of Object.entries(msg.names || {})) names.set(Number(id), text);
    const started = sentAt.get(msg.id);
    sentAt.delete(msg.id);
    if (msg.id !== latestId) return; // an answer overtaken by a newer request
    const next = { t0: msg.t0, t1: msg.t1, width: msg.width };
    let bytes = JSON.stringify(msg).length;
    msg.columns.forEach((name, i) => { next[name] = typed(name, buffers[i]); bytes += buffers[i].byteLength; });
    if (kind === "trace") indexRows(next);
    data = next;
    stats.answered = [msg.t0, msg.t1]; // the window the kernel drew
    stats.views += 1;
    stats.bytes.push(bytes);
    if (started !== undefined) stats.roundtrips.push(performance.now() - started);
    root.dataset.views = String(stats.views);
    status.textContent = kind === "trace"
      ? (nLanes ? `${formatTime(win[1] - win[0])} shown · ${msg.exact} events, ${msg.bins} bins` : "no events to draw")
      : `${formatTime(win[1] - win[0])} shown`;
    draw();
  }

  function indexRows(d) {
    // Per row id, the positions of its exact events and bins (for hit tests).
    d.exactOf = new Map();
    d.binsOf = new Map();
    const push = (m, k, i) => { let a = m.get(k); if (!a) m.set(k, (a = [])); a.push(i); };
    for (let i = 0; i < d.e_lane.length; i++) push(d.exactOf, d.e_lane[i], i);
    for (let i = 0; i < d.a_lane.length; i++) push(d.binsOf, d.a_lane[i], i);
  }

  function sizeCanvas(c, w, h, dpr) {
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
      c.style.width = w + "px";
      c.style.height = h + "px";
    }
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    return ctx;
  }

  function draw() {
    const started = performance.now();
    const w = cssWidth(), dpr = window.devicePixelRatio || 1;
    const ctx = sizeCanvas(canvas, w, plotHeight, dpr);
    const scale = w / (win[1] - win[0]);
    // Clamped to a little outside the canvas: at a 1 ns window an event far away is 1e9 px off.
    const x = (t) => Math.max(-8, Math.min(w + 8, (t - win[0]) * scale));
    if (kind === "trace") drawTrace(ctx, w, x, scale); else drawMemory(ctx, w, x);
    drawAxis(sizeCanvas(axisCanvas, w, AXIS_HEIGHT, dpr), w);
    const took = performance.now() - started;
    stats.draws.push(took);
    if (stats.draws.length > 500) stats.draws.shift();
    root.dataset.lastDrawMs = took.toFixed(2);
  }

  function rankExtent(rank) { // [first position, last position + 1] of a rank's rows
    let a = -1, b = -1;
    rows.forEach((r, i) => { if (r.rank === rank) { if (a < 0) a = i; b = i + 1; } });
    return a < 0 ? null : [a, b];
  }

  function drawTrace(ctx, w, x, scale) {
    const kinds = model.get("kinds");
    ctx.fillStyle = "rgba(242, 207, 91, 0.12)";
    const extents = new Map();
    for (const [rank, , a, b] of model.get("steps")) { // step bands, behind their rank's rows
      if (!extents.has(rank)) extents.set(rank, ranks.length ? rankExtent(rank) : [0, rows.length]);
      const e = extents.get(rank);
      if (!e) continue;
      const left = x(a), right = x(b);
      ctx.fillRect(left, e[0] * LANE_HEIGHT, Math.max(1, right - left), (e[1] - e[0]) * LANE_HEIGHT);
    }
    rows.forEach((r, i) => {
      if (r.type === "header") ctx.fillStyle = "rgba(0,0,0,0.09)";
      else if (r.type === "summary") ctx.fillStyle = "rgba(0,0,0,0.06)";
      else if (i % 2) ctx.fillStyle = "rgba(0,0,0,0.04)";
      else return;
      ctx.fillRect(0, i * LANE_HEIGHT, w, LANE_HEIGHT);
    });
    if (!data) return;
    const px = (data.t1 - data.t0) / data.width; // µs per pixel of the answer
    for (let i = 0; i < data.a_lane.length; i++) {
      const pos = rowOf.get(data.a_lane[i]);
      if (pos === undefined) continue; // a row folded since the request
      const t = data.t0 + data.a_px[i] * px;
      const left = x(t), right = x(t + px);
      if (right < 0 || left > w) continue;
      ctx.globalAlpha = Math.min(1, 0.25 + 0.75 * Math.min(1, data.a_busy[i]));
      ctx.fillStyle = KIND_COLOURS[kinds[data.a_kind[i]]] || "#888";
      ctx.fillRect(left, pos * LANE_HEIGHT + 4, Math.max(1, right - left), LANE_HEIGHT - 8);
    }
    ctx.globalAlpha = 1;
    for (let i = 0; i < data.e_lane.length; i++) {
      const pos = rowOf.get(data.e_lane[i]);
      if (pos === undefined) continue;
      const left = x(data.e_start[i]), right = x(data.e_start[i] + data.e_dur[i]);
      if (right < 0 || left > w) continue;
      ctx.fillStyle = KIND_COLOURS[kinds[data.e_kind[i]]] || "#888";
      const y = pos * LANE_HEIGHT + 2;
      ctx.fillRect(left, y, Math.max(1, right - left), LANE_HEIGHT - 4);
      if (right - left > 4) { // separate neighbours
        ctx.fillStyle = "rgba(255,255,255,0.6)";
        ctx.fillRect(left, y, 1, LANE_HEIGHT - 4);
      }
    }
  }

  function drawMemory(ctx, w, x) {
    if (!data) return;
    const cats = model.get("categories"), n = data.max_total.length, c = cats.length;
    let top = 1;
    for (let k = 0; k < n; k++) top = Math.max(top, data.max_total[k]);
    const y = (b) => plotHeight - (b / top) * (plotHeight - 14);
    const px = (data.t1 - data.t0) / data.width;
    const below = new Float64Array(n);
    for (let j = 0; j < c; j++) { // stacked columns, one per pixel of the answer
      ctx.fillStyle = CATEGORY_COLOURS[cats[j]] || "#888";
      for (let k = 0; k < n; k++) {
        const v = Math.max(0, data.at_max[k * c + j]);
        if (v <= 0) continue;
        const left = x(data.t0 + k * px), right = x(data.t0 + (k + 1) * px);
        ctx.fillRect(left, y(below[k] + v), Math.max(1, right - left), y(below[k]) - y(below[k] + v));
        below[k] += v;
      }
    }
    ctx.strokeStyle = "rgba(0,0,0,0.55)";
    ctx.setLineDash([3, 3]);
    ctx.beginPath(); // the lowest total inside each pixel
    for (let k = 0; k < n; k++) {
      const xx = x(data.t0 + (k + 0.5) * px);
      if (k === 0) ctx.moveTo(xx, y(data.min_total[k])); else ctx.lineTo(xx, y(data.min_total[k]));
    }
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.font = "11px sans-serif";
    for (let i = 1; i <= 4; i++) { // byte gridlines: a quarter of the highest total in view each
      const b = (top * i) / 4, yy = Math.round(y(b)) + 0.5;
      ctx.strokeStyle = "rgba(0,0,0,0.12)";
      ctx.beginPath(); ctx.moveTo(0, yy); ctx.lineTo(w, yy); ctx.stroke();
      ctx.fillStyle = "#333";
      ctx.fillText(formatBytes(b), 4, yy - 2);
    }
  }

  function drawAxis(ctx, w) {
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, w, AXIS_HEIGHT);
    ctx.strokeStyle = "#999";
    ctx.fillStyle = "#333";
    ctx.font = "11px sans-serif";
    ctx.beginPath(); ctx.moveTo(0, 0.5); ctx.lineTo(w, 0.5); ctx.stroke();
    const axis = axisTicks(win[0], win[1], w);
    let leftFree = 2; // labels never overlap the origin label or each other
    if (axis.base) {
      ctx.fillStyle = "#555";
      ctx.fillText(axis.base, 2, 16);
      leftFree = 2 + ctx.measureText(axis.base).width + 8;
      ctx.fillStyle = "#333";
    }
    const scale = w / (win[1] - win[0]);
    const shown = [];
    axis.times.forEach((t, i) => {
      const xx = Math.round((t - win[0]) * scale) + 0.5;
      ctx.beginPath(); ctx.moveTo(xx, 0); ctx.lineTo(xx, 4); ctx.stroke();
      const text = axis.labels[i];
      const tw = ctx.measureText(text).width;
      const at = Math.min(w - tw - 2, Math.max(leftFree, xx - tw / 2));
      if (at > xx + 2 || at + tw < xx - 2) return; // pushed off its tick by a neighbour: left out
      ctx.fillText(text, at, 16);
      leftFree = at + tw + 6;
      shown.push(text);
    });
    stats.ticks = shown;
    stats.axisBase = axis.base;
    stats.window = win.slice();
  }

  // ---------------------------------------------------------------- hit tests
  function hit(mx, my) {
    if (!data || my < 0 || my >= plotHeight) return null;
    const t = win[0] + (mx / cssWidth()) * (win[1] - win[0]);
    const tol = (2 / cssWidth()) * (win[1] - win[0]);
    if (kind === "memory") {
      const k = Math.floor(((t - data.t0) / (data.t1 - data.t0)) * data.width);
      return k >= 0 && k < data.width ? { k, t } : null;
    }
    const pos = Math.floor(my / LANE_HEIGHT);
    const row = rows[pos];
    if (!row || row.id < 0) return null;
    let best = null;
    for (const i of data.exactOf.get(row.id) || []) {
      const a = data.e_start[i], b = a + data.e_dur[i];
      if (t >= a - tol && t <= b + tol && (best === null || data.e_dur[i] < data.e_dur[best])) best = i;
    }
    if (best !== null) return { row, exact: best, t };
    const px = (data.t1 - data.t0) / data.width;
    const k = Math.floor((t - data.t0) / px);
    for (const i of data.binsOf.get(row.id) || []) if (Math.abs(data.a_px[i] - k) <= 1) return { row, bin: i, t };
    return null;
  }

  function tipLines(h) {
    if (kind === "memory") {
      const cats = model.get("categories"), c = cats.length, px = (data.t1 - data.t0) / data.width;
      const lines = [
        ["time", formatAt(data.t0 + h.k * px, px) + " – " + formatAt(data.t0 + (h.k + 1) * px, px)],
        ["highest total", formatBytes(data.max_total[h.k])],
        ["lowest total", formatBytes(data.min_total[h.k])],
      ];
      for (let j = c - 1; j >= 0; j--) {
        const v = data.at_max[h.k * c + j];
        if (v > 0) lines.push([cats[j], formatBytes(v)]);
      }
      return lines;
    }
    const laneLabel = h.row.type === "summary" ? `rank ${h.row.rank} (folded)` : h.row.label;
    const resolution = Math.max(1e-3, (win[1] - win[0]) / cssWidth()); // a pixel, at least 1 ns
    if (h.exact !== undefined) {
      const i = h.exact;
      return [
        ["name", names.get(data.e_name[i]) ?? "?"],
        ["duration", formatTime(data.e_dur[i])],
        ["start", formatAt(data.e_start[i], resolution)],
        ["lane", laneLabel],
      ];
    }
    const i = h.bin;
    return [
      ["events", `${data.a_count[i]} (narrower than a pixel)`],
      ["busy", `${Math.round(100 * data.a_busy[i])} % of the pixel`],
      ["longest", names.get(data.a_name[i]) ?? "?"],
      ["lane", laneLabel],
    ];
  }

  function showTip(h, clientX, clientY) {
    stats.hover = { t: h.t, row: h.row ? h.row.id : null, rank: h.row ? h.row.rank : null };
    tip.replaceChildren();
    for (const [key, value] of tipLines(h)) {
      const row = el("div", "nbt-tl-tip-row");
      // A long value (a templated kernel's name) takes at most three lines: the rows below it show.
      row.append(el("b", "", key + ": "), el("span", "", value));
      tip.append(row);
    }
    // Inside the widget's box: right of and below the pointer, else flipped left / above,
    // and clamped; never wider or taller than the widget (a long name wraps, then is cut).
    const box = root.getBoundingClientRect();
    const W = root.clientWidth, H = root.clientHeight;
    tip.style.maxWidth = Math.max(60, Math.min(520, W - 8)) + "px";
    tip.style.maxHeight = Math.max(30, H - 8) + "px";
    tip.style.display = "block";
    const tw = tip.offsetWidth, th = tip.offsetHeight;
    const mx = clientX - box.left, my = clientY - box.top;
    let left = mx + 12, top = my + 12;
    if (left + tw > W - 2) left = mx - 12 - tw;
    if (top + th > H - 2) top = my - 12 - th;
    tip.style.left = Math.max(2, Math.min(W - tw - 2, left)) + "px";
    tip.style.top = Math.max(2, Math.min(H - th - 2, top)) + "px";
  }

  // ---------------------------------------------------------------- interaction
  function clampWindow(a, b) {
    const full = span[1] - span[0];
    let w = Math.min(full, Math.max(b - a, MIN_WINDOW_US));
    if (!Number.isFinite(w)) w = full;
    if (!Number.isFinite(a)) a = span[0];
    a = Math.max(span[0], Math.min(a, span[1] - w));
    return [a, a + w];
  }

  function setWindow(a, b, delay) {
    win = clampWindow(a, b);
    draw();
    request(delay);
  }

  function onWheel(event) {
    event.preventDefault();
    const rect = canvas.getBoundingClientRect();
    const f = Math.max(0, Math.min(1, (event.clientX - rect.left) / rect.width));
    const at = win[0] + f * (win[1] - win[0]);
    const factor = Math.exp(Math.max(-1, Math.min(1, event.deltaY * 0.002)));
    const w = Math.max(MIN_WINDOW_US, (win[1] - win[0]) * factor);
    setWindow(at - f * w, at - f * w + w, 60);
  }

  let drag = null;
  function onDown(event) {
    drag = { x: event.clientX, win: win.slice(), moved: false };
  }
  function onMove(event) {
    const rect = canvas.getBoundingClientRect();
    const mx = event.clientX - rect.left, my = event.clientY - rect.top;
    if (drag) {
      const dx = event.clientX - drag.x;
      if (Math.abs(dx) > 3) drag.moved = true;
      if (drag.moved) {
        const shift = (dx / rect.width) * (drag.win[1] - drag.win[0]);
        setWindow(drag.win[0] - shift, drag.win[1] - shift, 60);
        tip.style.display = "none";
        return;
      }
    }
    const h = hit(mx, my);
    if (h) showTip(h, event.clientX, event.clientY); else tip.style.display = "none";
  }
  function onUp(event) {
    const was = drag;
    drag = null;
    if (!was || was.moved) return;
    const rect = canvas.getBoundingClientRect();
    const h = hit(event.clientX - rect.left, event.clientY - rect.top);
    if (!h) return;
    if (kind === "memory") model.send({ type: "select", time: data.max_time[h.k] });
    else model.send({ type: "select", lane: h.row.id, row: h.exact !== undefined ? data.e_row[h.exact] : data.a_row[h.bin] });
  }
  function onLeave() { tip.style.display = "none"; drag = null; }

  function showSelection() {
    const s = model.get("selected") || {};
    selection.replaceChildren();
    if (!Object.keys(s).length) return;
    let text;
    if (kind === "memory") {
      text = `selected: ${formatTime(s.time_us)} · ${formatBytes(s.total_bytes)} allocated`;
      const top = (s.alive || [])[0];
      if (top) text += ` · largest live: ${formatBytes(top.bytes)} ${top.category}` + (top.source ? ` from ${top.source}` : "");
    } else {
      const name = String(s.name ?? "?"); // whole in w.selected; cut on the page like the tooltip's
      text = `selected: ${name.length > 300 ? name.slice(0, 300) + "…" : name} · ${formatTime(s.dur_us)} · ${s.lane}`;
    }
    selection.append(el("span", "", text), el("span", "nbt-tl-hint", "  (w.selected in the notebook)"));
  }

  canvas.addEventListener("wheel", onWheel, { passive: false });
  canvas.addEventListener("mousedown", onDown);
  canvas.addEventListener("mousemove", onMove);
  canvas.addEventListener("mouseup", onUp);
  canvas.addEventListener("mouseleave", onLeave);
  reset.addEventListener("click", () => setWindow(span[0], span[1], 0));
  model.on("msg:custom", onMessage);
  model.on("change:selected", showSelection);
  const onWindow = () => { // the notebook set w.window: show that range
    const [a, b] = model.get("window");
    if (a !== win[0] || b !== win[1]) setWindow(a, b, 0);
  };
  model.on("change:window", onWindow);
  model.on("change:folded", refold); // the notebook set w.folded
  const resize = new ResizeObserver(() => { draw(); request(100); });
  resize.observe(stage);
  showSelection();
  draw();
  request(0);
  return () => {
    clearTimeout(timer);
    resize.disconnect();
    model.off("msg:custom", onMessage);
    model.off("change:selected", showSelection);
    model.off("change:window", onWindow);
    model.off("change:folded", refold);
  };
}

export default { render };
