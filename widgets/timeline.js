// nbtoolkit timeline widget: lanes of a Trace, or a stacked memory timeline, drawn on a canvas.
//
// The browser never holds the events. On every zoom or pan it asks the kernel for one screen
// ({type: "view", t0, t1, width}); the kernel answers with a few rectangles per pixel and lane
// in binary buffers (nbtoolkit/views/timeline_widget.py documents the columns). Until the answer
// arrives, the previous screen is redrawn under the new zoom, so the page reacts at once.
// Every text from the trace goes into the page through textContent, never as HTML.

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
const DTYPES = {
  e_lane: Uint16Array, e_start: Float64Array, e_dur: Float32Array, e_row: Int32Array,
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
  if (a >= 1e6) return (us / 1e6).toFixed(3) + " s";
  if (a >= 1e3) return (us / 1e3).toFixed(3) + " ms";
  if (a >= 1) return us.toFixed(2) + " µs";
  return (us * 1e3).toFixed(1) + " ns";
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
  const stats = { draws: [], roundtrips: [], views: 0, bytes: [] };

  const root = el("div", "nbt-timeline");
  root.__nbtStats = stats;
  const header = el("div", "nbt-tl-header");
  const title = el("span", "nbt-tl-title", model.get("title"));
  const status = el("span", "nbt-tl-status", "loading…");
  const reset = el("button", "nbt-tl-reset", "reset zoom");
  header.append(title, status, reset);
  const body = el("div", "nbt-tl-body");
  const labels = el("div", "nbt-tl-labels");
  const stage = el("div", "nbt-tl-stage");
  const canvas = el("canvas", "nbt-tl-canvas");
  const tip = el("div", "nbt-tl-tip");
  tip.style.display = "none";
  stage.append(canvas, tip);
  body.append(labels, stage);
  const legend = el("div", "nbt-tl-legend");
  const selection = el("div", "nbt-tl-selection");
  root.append(header, body, legend, selection);
  host.append(root);

  const lanes = model.get("lanes");
  const plotHeight = kind === "memory" ? MEMORY_HEIGHT : Math.max(1, lanes.length) * LANE_HEIGHT;
  const height = (model.get("height") || plotHeight) + AXIS_HEIGHT;
  stage.style.height = height + "px";
  if (kind === "trace") {
    for (const label of lanes) labels.append(el("div", "nbt-tl-label", label));
    for (const k of model.get("kinds")) {
      const item = el("span", "nbt-tl-key", k);
      item.style.setProperty("--swatch", KIND_COLOURS[k] || "#888");
      legend.append(item);
    }
  } else {
    labels.style.display = "none";
    for (const c of model.get("categories")) {
      const item = el("span", "nbt-tl-key", c);
      item.style.setProperty("--swatch", CATEGORY_COLOURS[c] || "#888");
      legend.append(item);
    }
  }

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
      model.send({ type: "view", t0: win[0], t1: win[1], width, id: latestId, client });
    }, delay);
  }

  function onMessage(msg, buffers) {
    if (!msg || typeof msg !== "object") return;
    if (msg.type === "error") { status.textContent = "kernel: " + msg.message; return; }
    if (msg.type !== "view") return;
    for (const [id, text] of Object.entries(msg.names || {})) names.set(Number(id), text);
    const started = sentAt.get(msg.id);
    sentAt.delete(msg.id);
    if (msg.id !== latestId) return; // an answer overtaken by a newer request
    const next = { t0: msg.t0, t1: msg.t1, width: msg.width };
    let bytes = JSON.stringify(msg).length;
    msg.columns.forEach((name, i) => { next[name] = typed(name, buffers[i]); bytes += buffers[i].byteLength; });
    if (kind === "trace") indexLanes(next);
    data = next;
    stats.views += 1;
    stats.bytes.push(bytes);
    if (started !== undefined) stats.roundtrips.push(performance.now() - started);
    root.dataset.views = String(stats.views);
    status.textContent = kind === "trace"
      ? `${formatTime(win[1] - win[0])} shown · ${msg.exact} events, ${msg.bins} bins`
      : `${formatTime(win[1] - win[0])} shown`;
    draw();
  }

  function indexLanes(d) {
    // Per lane, the positions of its exact events and bins (for hit tests).
    d.exactOf = lanes.map(() => []);
    d.binsOf = lanes.map(() => []);
    for (let i = 0; i < d.e_lane.length; i++) d.exactOf[d.e_lane[i]].push(i);
    for (let i = 0; i < d.a_lane.length; i++) d.binsOf[d.a_lane[i]].push(i);
  }

  function draw() {
    const started = performance.now();
    const w = cssWidth(), dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(height * dpr);
      canvas.style.width = w + "px";
      canvas.style.height = height + "px";
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, height);
    const scale = w / (win[1] - win[0]);
    const x = (t) => (t - win[0]) * scale;
    if (kind === "trace") drawTrace(ctx, w, x, scale); else drawMemory(ctx, w, x);
    drawAxis(ctx, w, x);
    const took = performance.now() - started;
    stats.draws.push(took);
    if (stats.draws.length > 500) stats.draws.shift();
    root.dataset.lastDrawMs = took.toFixed(2);
  }

  function drawTrace(ctx, w, x, scale) {
    const kinds = model.get("kinds");
    for (const [, a, b] of model.get("steps")) { // step bands
      ctx.fillStyle = "rgba(242, 207, 91, 0.12)";
      ctx.fillRect(x(a), 0, Math.max(1, (b - a) * scale), plotHeight);
    }
    ctx.fillStyle = "rgba(0,0,0,0.04)";
    for (let l = 1; l < lanes.length; l += 2) ctx.fillRect(0, l * LANE_HEIGHT, w, LANE_HEIGHT);
    if (!data) return;
    const px = (data.t1 - data.t0) / data.width; // µs per pixel of the answer
    for (let i = 0; i < data.a_lane.length; i++) {
      const t = data.t0 + data.a_px[i] * px;
      const left = x(t), right = x(t + px);
      if (right < 0 || left > w) continue;
      ctx.globalAlpha = Math.min(1, 0.25 + 0.75 * Math.min(1, data.a_busy[i]));
      ctx.fillStyle = KIND_COLOURS[kinds[data.a_kind[i]]] || "#888";
      ctx.fillRect(left, data.a_lane[i] * LANE_HEIGHT + 4, Math.max(1, right - left), LANE_HEIGHT - 8);
    }
    ctx.globalAlpha = 1;
    for (let i = 0; i < data.e_lane.length; i++) {
      const left = x(data.e_start[i]), right = x(data.e_start[i] + data.e_dur[i]);
      if (right < 0 || left > w) continue;
      ctx.fillStyle = KIND_COLOURS[kinds[data.e_kind[i]]] || "#888";
      const y = data.e_lane[i] * LANE_HEIGHT + 2;
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

  function drawAxis(ctx, w, x) {
    const y0 = height - AXIS_HEIGHT;
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, y0, w, AXIS_HEIGHT);
    ctx.strokeStyle = "#999";
    ctx.fillStyle = "#333";
    ctx.font = "11px sans-serif";
    ctx.beginPath(); ctx.moveTo(0, y0); ctx.lineTo(w, y0); ctx.stroke();
    const ticks = 6;
    for (let i = 0; i <= ticks; i++) {
      const t = win[0] + ((win[1] - win[0]) * i) / ticks;
      const xx = Math.min(w - 1, Math.max(0, x(t)));
      ctx.beginPath(); ctx.moveTo(xx, y0); ctx.lineTo(xx, y0 + 4); ctx.stroke();
      const text = formatTime(t);
      const tw = ctx.measureText(text).width;
      ctx.fillText(text, Math.min(w - tw - 2, Math.max(2, xx - tw / 2)), y0 + 16);
    }
  }

  // ---------------------------------------------------------------- hit tests
  function hit(mx, my) {
    if (!data || my >= plotHeight) return null;
    const t = win[0] + (mx / cssWidth()) * (win[1] - win[0]);
    const tol = (2 / cssWidth()) * (win[1] - win[0]);
    if (kind === "memory") {
      const k = Math.floor(((t - data.t0) / (data.t1 - data.t0)) * data.width);
      return k >= 0 && k < data.width ? { k, t } : null;
    }
    const lane = Math.floor(my / LANE_HEIGHT);
    if (lane < 0 || lane >= lanes.length) return null;
    let best = null;
    for (const i of data.exactOf[lane]) {
      const a = data.e_start[i], b = a + data.e_dur[i];
      if (t >= a - tol && t <= b + tol && (best === null || data.e_dur[i] < data.e_dur[best])) best = i;
    }
    if (best !== null) return { lane, exact: best };
    const px = (data.t1 - data.t0) / data.width;
    const k = Math.floor((t - data.t0) / px);
    for (const i of data.binsOf[lane]) if (Math.abs(data.a_px[i] - k) <= 1) return { lane, bin: i };
    return null;
  }

  function tipLines(h) {
    if (kind === "memory") {
      const cats = model.get("categories"), c = cats.length, px = (data.t1 - data.t0) / data.width;
      const lines = [
        ["time", formatTime(data.t0 + h.k * px) + " – " + formatTime(data.t0 + (h.k + 1) * px)],
        ["highest total", formatBytes(data.max_total[h.k])],
        ["lowest total", formatBytes(data.min_total[h.k])],
      ];
      for (let j = c - 1; j >= 0; j--) {
        const v = data.at_max[h.k * c + j];
        if (v > 0) lines.push([cats[j], formatBytes(v)]);
      }
      return lines;
    }
    const laneLabel = lanes[h.lane];
    if (h.exact !== undefined) {
      const i = h.exact;
      return [
        ["name", names.get(data.e_name[i]) ?? "?"],
        ["duration", formatTime(data.e_dur[i])],
        ["start", formatTime(data.e_start[i])],
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

  function showTip(h, mx, my) {
    tip.replaceChildren();
    for (const [key, value] of tipLines(h)) {
      const row = el("div", "nbt-tl-tip-row");
      row.append(el("b", "", key + ": "), el("span", "", value));
      tip.append(row);
    }
    tip.style.display = "block";
    const maxLeft = stage.clientWidth - tip.offsetWidth - 4;
    tip.style.left = Math.max(0, Math.min(maxLeft, mx + 12)) + "px";
    tip.style.top = (my + 12) + "px";
  }

  // ---------------------------------------------------------------- interaction
  function clampWindow(a, b) {
    const full = span[1] - span[0];
    let w = Math.min(full, Math.max(b - a, 1e-3));
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
    const f = (event.clientX - rect.left) / rect.width;
    const at = win[0] + f * (win[1] - win[0]);
    const factor = Math.exp(Math.max(-1, Math.min(1, event.deltaY * 0.002)));
    const w = (win[1] - win[0]) * factor;
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
    if (h) showTip(h, mx, my); else tip.style.display = "none";
  }
  function onUp(event) {
    const was = drag;
    drag = null;
    if (!was || was.moved) return;
    const rect = canvas.getBoundingClientRect();
    const h = hit(event.clientX - rect.left, event.clientY - rect.top);
    if (!h) return;
    if (kind === "memory") model.send({ type: "select", time: data.max_time[h.k] });
    else model.send({ type: "select", lane: h.lane, row: h.exact !== undefined ? data.e_row[h.exact] : data.a_row[h.bin] });
  }
  function onLeave() { tip.style.display = "none"; drag = null; }

  function showSelection() {
    const s = model.get("selected") || {};
    selection.replaceChildren();
    if (!Object.keys(s).length) return;
    const text = kind === "memory"
      ? `selected: ${formatTime(s.time_us)} · ${formatBytes(s.total_bytes)} allocated`
      : `selected: ${s.name} · ${formatTime(s.dur_us)} · ${s.lane}`;
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
  };
}

export default { render };
